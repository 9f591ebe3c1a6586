"""
train.py's flags made into its two configs, and checked: model.py's GPTConfig (a --preset first, then the
explicit flags) and train.py's TrainConfig. GPTConfig checks its own combinations; here are the ranges of the
training flags, the warnings for flags that change nothing in a configuration, and the configs of a resumed run.

In the order a run meets them: `model_flags(given)` are the GPTConfig fields the command line asks for (its
preset's, then the explicit ones); `check_train_config(tc, given)` refuses a value out of range in one line, before
anything is written, and `absolute_paths(tc)` makes --dataset and --data_dir absolute, as the run records them;
`no_effect_warnings(given, model_cfg, tc)` are the warnings for flags that change nothing. On --resume,
`resume_configs(given, checkpoint, world_size, tc)` takes the checkpoint's configs, with the flags given on top
where a resume may change them; a change that would make it another run is one line. Once the data is prepared,
`fit_to_data(model_cfg, tc, meta, given, resumed)` sets the vocabulary from the tokenizer's, and
`check_resumed_data(checkpoint, meta)` refuses a resume onto data other than the run's.
"""

import dataclasses
import math
import os
import re

import data
from engine.flags import UsageError
from model import GPTConfig, PRESETS, block_layout
from norms import NORM_FLAGS, reads

# Flags of the machine, not of the run: a resume takes them from its own command line, not the checkpoint.
SYSTEM_FLAGS = ("out_dir", "device", "dtype", "compile", "overwrite", "resume")


def model_flags(given):
    """The model flags a command line asks for: its preset's (model.PRESETS), then the explicit ones."""
    model_args = dict(PRESETS[given["preset"]]) if given.get("preset") else {}
    model_args.update({k: v for k, v in given.items() if k in GPTConfig.__dataclass_fields__})
    return model_args


# an AdamW LR this large moves every weight by ~1,000 a step: a typo, and past float32 it breaks the optimizer
MAX_LR = 1e3


def check_train_config(tc, given):
    positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval",
                "keep_checkpoints")
    for name in positive:
        if getattr(tc, name) < 1:
            raise UsageError(f"--{name}={getattr(tc, name)} must be a positive integer")
    # a flag the schedule does not read is held to its sign only (no_effect_warnings says it is unused): the
    # default --min_lr above a small --lr is no error in a ramp, which never decays
    decays, warms = tc.lr_schedule in ("cosine", "linear"), tc.lr_schedule != "ramp"
    ranges = (
        ("lr", tc.lr > 0, "> 0"),
        ("lr", tc.lr <= MAX_LR, f"at most {MAX_LR:g} (AdamW moves every weight by about the LR each step)"),
        ("min_lr", 0 <= tc.min_lr and (tc.min_lr <= tc.lr or not decays), f"in [0, --lr={tc.lr}]"),
        # a short test run may leave the default warmup unfinished; an explicit one must fit in the run
        ("warmup_iters", 0 <= tc.warmup_iters and (
            tc.warmup_iters <= tc.max_iters or "warmup_iters" not in given or not warms),
         f"in [0, --max_iters={tc.max_iters}]"),
        ("lr_decay_iters", tc.lr_decay_iters is None or tc.lr_decay_iters >= 1 and (
            tc.lr_decay_iters >= tc.warmup_iters or "lr_decay_iters" not in given or not decays),
         f">= --warmup_iters={tc.warmup_iters} and >= 1, or None"),
        ("weight_decay", tc.weight_decay >= 0, ">= 0"),
        ("beta1", 0 <= tc.beta1 < 1, "in [0, 1)"),
        ("beta2", 0 <= tc.beta2 < 1, "in [0, 1)"),
        ("grad_clip", tc.grad_clip >= 0, ">= 0 (0 turns clipping off)"),
        ("seed", 0 <= tc.seed < 2 ** 63, "in [0, 2^63)"),
        ("gpu_peak_tflops", tc.gpu_peak_tflops is None or tc.gpu_peak_tflops > 0, "> 0, or None"),
        ("diverge_gap", tc.diverge_gap >= 0, ">= 0 (0 turns it off)"),
        ("spike_window", tc.spike_window >= 2, ">= 2 (a standard deviation needs two values)"),
        ("spike_z", tc.spike_z > 0, "> 0"),
        ("telemetry_interval", tc.telemetry_interval >= 0, ">= 0 (0 turns it off)"),
        ("fp16_headroom_interval", tc.fp16_headroom_interval >= 0, ">= 0 (0 turns it off)"),
        ("z_loss", tc.z_loss >= 0, ">= 0 (0 turns it off)"),
        ("seq_warmup_iters", tc.seq_warmup_iters >= 0, ">= 0 (0 turns it off)"),
        ("seq_warmup_start", tc.seq_warmup_start >= 1, ">= 1"),
    )
    for name, ok, allowed in ranges:
        if not ok:
            raise UsageError(f"--{name}={getattr(tc, name)} must be {allowed}")
    if tc.resume and tc.overwrite:
        raise UsageError("--resume and --overwrite together: --resume continues the run in --out_dir, --overwrite "
                         "replaces it; give one of them")
    # an index of at most 4 digits: torch.device refuses one past a C int with a traceback of its own
    if not re.fullmatch(r"auto|(cpu|cuda|mps)(:[0-9]{1,4})?", tc.device):
        raise UsageError(f"--device={tc.device} is not a device; choose auto, cpu, cuda, cuda:N or mps (N < 10000)")
    if not tc.out_dir.strip():
        raise UsageError("--out_dir is empty; give a folder for config.json, log.jsonl and checkpoints")
    if not tc.data_dir.strip():
        raise UsageError("--data_dir is empty (it would prepare into the current folder); give a folder for the "
                         "prepared data, such as data")


def dataset_path(dataset):
    """--dataset as a run records it: builtin and shakespeare by name, a path made absolute (an empty one stays
    empty, for data.prepare to refuse)."""
    return dataset if dataset in ("builtin", "shakespeare") or not dataset.strip() else os.path.abspath(dataset)


def absolute_paths(tc):
    """tc with --dataset and --data_dir absolute: a run resumed from another folder reads the same files."""
    return dataclasses.replace(tc, dataset=dataset_path(tc.dataset), data_dir=os.path.abspath(tc.data_dir))


def no_effect_warnings(given, m, tc):
    """Flags given on the command line that change nothing in this configuration (a warning, not an error)."""
    unused = {name: f"--norm={m.norm}" for name in NORM_FLAGS if name not in reads(m.norm)}
    if not m.scale_resids:
        unused["scale_resids_init"] = "--scale_resids=False"
    if not m.layer_scale:
        unused["layer_scale_init"] = "--layer_scale=False"
    if not m.embed_scale:
        unused["embed_scale_learned"] = "--embed_scale=False"
    if not m.scale_heads:
        unused["head_scale_at"] = "--scale_heads=False"
    if m.layout != "mix":
        unused["mix_ln_ratio"] = f"--layout={m.layout}"
    # LayerNorm Scaling multiplies layer l's pre-LN norms by 1/sqrt(l): only a Pre-LN layer after the first changes
    # anything, and Mix-LN's Post-LN layers come first
    if m.layout == "mix" and block_layout(m, m.n_layer - 1) == "post":
        unused["layer_norm_scaling"] = f"--layout=mix --mix_ln_ratio={m.mix_ln_ratio} (every layer is Post-LN)"
    elif m.n_layer == 1 and m.layout in ("pre", "mix"):
        unused["layer_norm_scaling"] = "--n_layer=1 (its one layer is scaled by 1/sqrt(1) = 1)"
    if m.subln:
        unused["scale_fc"] = "--subln=True (SubLN puts the same norm before W_2)"
    if m.attn_softcap > 0:
        unused["attn_impl"] = f"--attn_softcap={m.attn_softcap} (a soft-cap forces the manual attention path)"
    if tc.lr_schedule in ("constant", "ramp"):
        unused.update(min_lr=f"--lr_schedule={tc.lr_schedule}", lr_decay_iters=f"--lr_schedule={tc.lr_schedule}")
    if tc.lr_schedule == "ramp":
        unused["warmup_iters"] = "--lr_schedule=ramp"
    if not tc.seq_warmup_iters:
        unused["seq_warmup_start"] = "--seq_warmup_iters=0"
    return [f"train.py: warning: --{name} has no effect with {why}" for name, why in unused.items() if name in given]


def resume_configs(given, checkpoint, world_size, tc):
    """The checkpoint's model and training config, with the flags given on top where a resume can change
    them (tc: the config of the command line alone); an inconsistent resume is one line."""
    saved_model, saved_train = checkpoint["model_config"], checkpoint["train_config"]
    step = checkpoint["step"]
    changed = [k for k, v in model_flags(given).items() if saved_model.get(k, v) != v]
    if given.get("preset") not in (None, saved_train.get("preset")):
        changed.insert(0, "preset")
    if changed:
        raise UsageError(f"--resume: {', '.join('--' + k for k in changed)} differ from the checkpoint's; a "
                         "resumed run keeps its model (use another --out_dir for a new one)")
    if "dataset" in given and tc.dataset != dataset_path(saved_train.get("dataset", "")):
        raise UsageError(f"--resume: --dataset={given['dataset']} differs from the checkpoint's "
                         f"{saved_train.get('dataset')}; a resumed run keeps its data")
    if "tokenizer" in given and given["tokenizer"] != saved_train.get("tokenizer"):
        raise UsageError(f"--resume: --tokenizer={given['tokenizer']} differs from the checkpoint's "
                         f"{saved_train.get('tokenizer')}; a resumed run keeps its data")
    if len(checkpoint["rng"]) != world_size:
        raise UsageError(f"--resume: the checkpoint was written by {len(checkpoint['rng'])} processes, this run has "
                         f"{world_size}; exact resume needs the same number (torchrun --nproc_per_node)")
    try:
        model_cfg = GPTConfig(**saved_model)
        known = {k: v for k, v in saved_train.items() if k in tc.__dataclass_fields__}
        known.update(lr_decay_iters=known.get("lr_decay_iters") or known.get("max_iters"))
        # the saved values, except the machine's flags and those given now: tc has those already
        tc = dataclasses.replace(tc, **{k: v for k, v in known.items() if k not in SYSTEM_FLAGS and k not in given})
    except (TypeError, ValueError) as e:
        raise UsageError(f"--resume: the checkpoint's config is not nanonorm's ({e})") from None
    if tc.max_iters <= step:
        raise UsageError(f"--resume: the checkpoint is at step {step} and --max_iters={tc.max_iters}; to train on, "
                         f"raise --max_iters (the LR keeps its schedule to --lr_decay_iters={tc.lr_decay_iters})")
    return model_cfg, tc


def check_resumed_data(checkpoint, meta):
    """A resumed run trains on the text it started on: the sha256 its checkpoint records is the prepared data's.
    (A checkpoint that records none is not checked.)"""
    started_on, now = checkpoint.get("data_sha256"), meta["source"]["sha256"]
    if started_on and started_on != now:
        raise UsageError(f"--resume: the data has changed since the run started ({meta['source']['path']}: text sha256 "
                         f"{now[:12]}, the run trained on {started_on[:12]}); put the run's data back, or start a new "
                         "run in another --out_dir")


def fit_to_data(model_cfg, tc, meta, given, resumed):
    """The model config for this prepared dataset (meta.json): the vocabulary padded from the tokenizer's, unless
    given or resumed; PowerNorm's warmup from the LR warmup, unless given. Too short a dataset is one line."""
    data.check_length(meta, model_cfg.block_size)
    if tc.seq_warmup_iters and tc.seq_warmup_start > model_cfg.block_size:
        raise UsageError(f"--seq_warmup_start={tc.seq_warmup_start} must be <= --block_size={model_cfg.block_size}")
    padded_vocab = 64 * math.ceil(meta["vocab_size"] / 64)  # a multiple of 64 is faster on GPUs (nanoGPT)
    if "vocab_size" in given or resumed:
        if model_cfg.vocab_size < meta["vocab_size"]:
            raise UsageError(f"--vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
                             f"{meta['vocab_size']}")
    else:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=padded_vocab)
    if model_cfg.pn_warmup is None:
        # PowerNorm App. A.1 sets its psi warmup to the LR warmup (here counted in training forward calls); a
        # ramp has no LR warmup (--warmup_iters has no effect there), so PowerNorm's psi warmup is 0 too
        warmup = 0 if tc.lr_schedule == "ramp" else tc.warmup_iters
        model_cfg = dataclasses.replace(model_cfg, pn_warmup=warmup * tc.grad_accum)
    return model_cfg

"""
A run's configs from its command line, resolved in one place: model.py's GPTConfig (a --preset first, then the
explicit flags) and TrainConfig. `resolve` is the whole resolution, as nanoGPT resolves its model_args once: the
flags (from_flags); on --resume the checkpoint's configs with the flags a resume may change on top
(resume_configs); the vocabulary and PowerNorm's warmup (fit_to_tokenizer); and the device, dtype and compile of
this machine (runtime.resolve_device). It reads nothing but its arguments and the machine, so the configs of a run
are known without running it, and a second copy of a rule has no reason to exist. GPTConfig checks its own
combinations; here are the checks of the training flags (their float ranges are engine/flags.FLOAT_RANGES, one
table with the model's), RESUME (what a resume may change of a run, flag by flag), the warnings for flags that
change nothing, and `check_data`, which holds the prepared data to the configs.
"""

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional

import data
from engine import flags
from engine import runtime
from engine.flags import UsageError
from model import GPTConfig, PRESETS, block_layout
from norms import NORM_FLAGS, reads


@dataclass
class TrainConfig:
    # data
    dataset: str = "builtin"
    tokenizer: Literal["byte", "gpt2"] = "byte"
    data_dir: str = "data"
    batch_size: int = 16  # sequences per micro-step on each process
    grad_accum: int = 1  # micro-steps per optimizer step on each process
    # optimizer and schedule
    lr: float = 4e-3
    min_lr: float = 4e-4
    warmup_iters: int = 50
    max_iters: int = 800
    lr_decay_iters: Optional[int] = None  # None: decay until max_iters
    lr_schedule: Literal["cosine", "linear", "constant", "ramp"] = "cosine"  # ramp: NormFormer §4 LR stability test
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    # evaluation, logging, checkpoints
    out_dir: str = "out"
    eval_interval: int = 200
    eval_iters: int = 10  # eval_iters x batch_size fixed windows per split (data.eval_starts), on all processes
    log_interval: int = 25
    always_save_checkpoint: bool = True
    resume: bool = False
    preset: Optional[str] = None
    seed: int = 1337
    overwrite: bool = False  # start afresh in an out_dir that holds a run
    keep_checkpoints: int = 1  # ckpt-<step>.pt of the last K checkpoints, and of the best
    # loss-spike instruments (probes.py) and mitigations
    diverge_loss: Optional[float] = None  # diverged above this loss 3 steps in a row; None: first loss + 1
    diverge_gap: float = 1.5  # diverged when the 10-step mean loss is this far above its best; 0: off
    spike_window: int = 100  # steps in the spike monitor's running mean and std
    spike_z: float = 5.0  # a loss or grad-norm z-score above this is a spike
    skip_spikes: bool = False  # skip the optimizer step of a spike (llm.c)
    telemetry_interval: int = 0  # a "telemetry" event every N steps; 0: off
    fp16_headroom_interval: int = 0  # a "headroom" event (max |x| per op and layer) every N steps; 0: off
    fp16_overflow_fails: bool = False  # diverged at the first op output over 65504 (NormFormer's float16 failure)
    z_loss: float = 0.0  # adds z_loss * mean(log Z)^2 to the training loss (PaLM)
    seq_warmup_iters: int = 0  # steps over which the sequence length grows to block_size; 0: off
    seq_warmup_start: int = 8  # the sequence length at step 0 of the sequence-length warmup
    # system
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    compile: Optional[bool] = None  # None: on CUDA, off on CPU (where inductor is slower at small shapes)
    gpu_peak_tflops: Optional[float] = None  # for MFU; None: looked up by GPU name


CHOICES = {"preset": list(PRESETS)}  # allowed values of the flags whose type does not list them


def parse_flags(argv):
    """{flag: value} of the flags a train.py command line sets."""
    return flags.parse(argv, GPTConfig, TrainConfig, choices=CHOICES)


def model_flags(given):
    """The model flags a command line asks for: its preset's (model.PRESETS), then the explicit ones."""
    model_args = dict(PRESETS[given["preset"]]) if given.get("preset") else {}
    model_args.update({k: v for k, v in given.items() if k in GPTConfig.__dataclass_fields__})
    return model_args


def build_configs(given):
    """The preset first, then the explicit flags; a meaningless combination is one line (GPTConfig's checks)."""
    try:
        return GPTConfig(**model_flags(given)), flags.build(TrainConfig, given)
    except ValueError as e:
        raise UsageError(preset_named(str(e), given)) from None


def preset_named(text, given):
    """text (a refusal or a warning), saying which of the flags it names the preset set, not the command line:
    --preset=olmo2 --norm=batchnorm is refused for --qk_norm, which only the preset set."""
    preset = PRESETS.get(given.get("preset"), {})
    named = [name for name in preset if name not in given and re.search(rf"--{name}\b", text)]
    if not named:
        return text
    return f"{text} (the preset {given['preset']} sets {', '.join(f'--{n}={preset[n]}' for n in named)})"


def from_flags(given):
    """The configs of the flags alone, checked (check_train_config), with absolute paths."""
    model_cfg, tc = build_configs(given)
    check_train_config(tc, given)
    return model_cfg, absolute_paths(tc)


class RunConfigs(NamedTuple):
    """What resolve gives: the run's model config, its training config, and its device (None without the machine)."""
    model: GPTConfig
    train: TrainConfig
    device: Optional[str]


def resolve(given, checkpoint=None, world_size=1, machine=True):
    """The RunConfigs a run will have: the flags (from_flags); on --resume the checkpoint's configs
    with the flags given on top where a resume may change them (resume_configs); the vocabulary and PowerNorm's
    warmup (fit_to_tokenizer); and with machine, --device, --dtype and --compile made concrete on this machine
    (runtime.resolve_device; without it they stay as given, MACHINE_SETTINGS, and the device is None).
    Bad input is a UsageError of one line. Reads nothing but its arguments and the machine."""
    model_cfg, tc = from_flags(given)
    if checkpoint:
        model_cfg, tc = resume_configs(given, checkpoint, world_size, tc)
        check_train_config(tc, given)
        tc = absolute_paths(tc)  # a checkpoint's configs may hold relative paths
    model_cfg = fit_to_tokenizer(model_cfg, tc, given, resumed=checkpoint is not None)
    device = None
    if machine:
        device, tc = runtime.resolve_device(tc)
    return RunConfigs(model_cfg, tc, device)


# Flags of the machine, not of the run: a resume takes them from its own command line, not the checkpoint.
SYSTEM_FLAGS = ("out_dir", "device", "dtype", "compile", "overwrite", "resume")
# the settings resolve() makes concrete on the machine (runtime.resolve_device) where they are left at the default
MACHINE_SETTINGS = ("dtype", "compile")
MAX_LR = flags.FLOAT_RANGES["lr"].high  # the largest --lr (flags.FLOAT_RANGES), for the scripts with an LR of their own


def check_train_config(tc, given):
    positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval",
                "keep_checkpoints")
    for name in positive:
        if getattr(tc, name) < 1:
            raise UsageError(f"--{name}={getattr(tc, name)} must be a positive integer")
    # a flag the schedule does not read is held to its sign only (no_effect_warnings says it is unused): the
    # default --min_lr above a small --lr is no error in a ramp, which never decays
    problem = flags.first_out_of_range(tc)
    if problem:
        raise UsageError(problem)
    decays, warms = tc.lr_schedule in ("cosine", "linear"), tc.lr_schedule != "ramp"
    ranges = (
        ("min_lr", tc.min_lr <= tc.lr or not decays, f"in [0, --lr={tc.lr}]"),
        # a short test run may leave the default warmup unfinished; an explicit one must fit in the run
        ("warmup_iters", 0 <= tc.warmup_iters and (
            tc.warmup_iters <= tc.max_iters or "warmup_iters" not in given or not warms),
         f"in [0, --max_iters={tc.max_iters}]"),
        ("lr_decay_iters", tc.lr_decay_iters is None or tc.lr_decay_iters >= 1 and (
            tc.lr_decay_iters >= tc.warmup_iters or "lr_decay_iters" not in given or not decays),
         f">= --warmup_iters={tc.warmup_iters} and >= 1, or None"),
        ("seed", 0 <= tc.seed < 2 ** 63, "in [0, 2^63)"),
        ("spike_window", tc.spike_window >= 2, ">= 2 (a standard deviation needs two values)"),
        ("telemetry_interval", tc.telemetry_interval >= 0, ">= 0 (0 turns it off)"),
        ("fp16_headroom_interval", tc.fp16_headroom_interval >= 0, ">= 0 (0 turns it off)"),
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
    return [preset_named(f"train.py: warning: --{name} has no effect with {why}", given)
            for name, why in unused.items() if name in given]


def damaged_configs(checkpoint):
    """What is wrong with a checkpoint's model_config or train_config ("train_config.lr=-5.0 must be in [1e-07, 1000]"),
    or None: every value has its flag's type, and the configs pass the checks a command line's flags pass
    (GPTConfig's, check_train_config, fit_to_tokenizer's), with each flag named as the checkpoint's field, not as a
    flag the user never gave. run_folder.read_checkpoint asks it, so a damaged checkpoint is passed over as one
    that does not load; a train_config key that is no flag (one of an older nanonorm) is left unread."""
    saved_model, saved_train = checkpoint["model_config"], checkpoint["train_config"]
    foreign = [name for name in saved_model if name not in GPTConfig.__dataclass_fields__]
    if foreign:
        return f"model_config.{foreign[0]} is not a flag of this model.py"
    types = flags.field_types(GPTConfig, TrainConfig)
    for section, config in (("model_config", saved_model), ("train_config", saved_train)):
        for name, value in config.items():
            problem = flags.wrong_type(name, value, types[name], CHOICES) if name in types else None
            if problem:
                return f"{section}.{problem}"
    try:
        model_cfg, tc = GPTConfig(**saved_model), flags.build(TrainConfig, saved_train)
        check_train_config(tc, given={})  # nothing given: the checks of an explicit flag's fit are left out
        fit_to_tokenizer(model_cfg, tc, {}, resumed=True)
    except (ValueError, UsageError) as e:
        return as_fields(str(e))
    return None


def as_fields(text):
    """text (a refusal of flags) with each --flag named as a checkpoint's field: train_config.lr, model_config.norm."""
    def field(match):
        section = "model_config" if match[1] in GPTConfig.__dataclass_fields__ else "train_config"
        return f"{section}.{match[1]}"
    return re.sub(r"--(\w+)", field, text)


def resume_configs(given, checkpoint, world_size, tc):
    """The checkpoint's model and training config (checked by damaged_configs as it was read), with the flags given
    on top where a resume can change them (tc: the config of the command line alone); an inconsistent resume is
    one line."""
    saved_model, saved_train = checkpoint["model_config"], checkpoint["train_config"]
    step = checkpoint["step"]
    changed = [k for k, v in model_flags(given).items() if saved_model.get(k, v) != v]
    if given.get("preset") not in (None, saved_train.get("preset")):
        changed.insert(0, "preset")
    if changed:
        raise UsageError(f"--resume: {', '.join('--' + k for k in changed)} differ from the checkpoint's; a "
                         "resumed run keeps its model (use another --out_dir for a new one)")
    check_kept(given, saved_train)
    if len(checkpoint["rng"]) != world_size:
        raise UsageError(f"--resume: the checkpoint was written by {len(checkpoint['rng'])} processes, this run has "
                         f"{world_size}; exact resume needs the same number (torchrun --nproc_per_node)")
    model_cfg = GPTConfig(**saved_model)  # damaged_configs has built it once, when the checkpoint was read
    known = {k: saved_value(saved_train, k) for k in saved_train if k in tc.__dataclass_fields__}
    # the saved values, except the machine's flags and those given now: tc has those already
    tc = dataclasses.replace(tc, **{k: v for k, v in known.items() if k not in SYSTEM_FLAGS and k not in given})
    # a checkpoint a stop wrote during the last evaluation still owes that evaluation and the run's "done" line
    owed = tc.max_iters == step and not checkpoint.get("evaluated", True)
    if tc.max_iters <= step and not owed:
        raise UsageError(f"--resume: the checkpoint is at step {step} and --max_iters={tc.max_iters}; to train on, "
                         f"raise --max_iters (the LR keeps its schedule to --lr_decay_iters={tc.lr_decay_iters})")
    return model_cfg, tc


# What a resume does with each training flag (a test holds the table to TrainConfig's fields). The promise is the
# same losses as an uninterrupted run, and a config.json that says what trained every step:
#   KEPT     the steps so far trained with it, or it sets the data order: a resume may repeat it, not change it
#   EXTENDS  it says how far the run goes, how it is logged, checkpointed or judged from the resumed step on:
#            a resume may change it, and the change is logged (resume_changes)
#   MACHINE  where and how this process runs (SYSTEM_FLAGS, the data's folder: its text is checked by its sha256):
#            from the resume's own command line, and a change is logged too
#   BOOKKEEPING  where the run is and how this command starts it: no setting of the run
KEPT, EXTENDS, MACHINE, BOOKKEEPING = "kept", "extends", "machine", "bookkeeping"
RESUME = {
    "dataset": KEPT, "tokenizer": KEPT, "data_dir": MACHINE,
    "batch_size": KEPT, "grad_accum": KEPT,  # the batches of every step, and so the data order
    "lr": KEPT, "min_lr": KEPT, "warmup_iters": KEPT, "lr_schedule": KEPT,  # the LR of the steps so far
    "max_iters": EXTENDS,
    "lr_decay_iters": EXTENDS,  # None on resume means the checkpoint's (resume_configs)
    "weight_decay": KEPT, "beta1": KEPT, "beta2": KEPT, "grad_clip": KEPT,  # the optimizer the steps so far used
    "out_dir": BOOKKEEPING, "eval_interval": EXTENDS,
    "eval_iters": KEPT,  # the windows every val loss so far, and the best one, were measured on
    "log_interval": EXTENDS, "always_save_checkpoint": EXTENDS, "resume": BOOKKEEPING, "preset": KEPT,
    "seed": KEPT,  # the initial weights and every batch
    "overwrite": BOOKKEEPING, "keep_checkpoints": EXTENDS,
    # the divergence and spike bounds judge the steps from the resumed one on (docs/guarantees.md)
    "diverge_loss": EXTENDS, "diverge_gap": EXTENDS, "spike_window": EXTENDS, "spike_z": EXTENDS,
    "skip_spikes": KEPT,  # which updates the steps so far skipped
    # the instruments read the run on a separate pass and leave it as it was (diagnostics/instruments.py)
    "telemetry_interval": EXTENDS, "fp16_headroom_interval": EXTENDS, "fp16_overflow_fails": EXTENDS,
    "z_loss": KEPT, "seq_warmup_iters": KEPT, "seq_warmup_start": KEPT,  # the loss and the batches of each step
    "device": MACHINE, "dtype": MACHINE, "compile": MACHINE, "gpu_peak_tflops": EXTENDS,
}


def kept_flags():
    """The training flags no resume changes (RESUME's KEPT): a checkpoint and its run's config.json agree on them."""
    return [name for name, rule in RESUME.items() if rule == KEPT]


def saved_value(saved_train, name):
    """A flag's value in the checkpoint's train_config as a resume compares it: --dataset as an absolute path,
    lr_decay_iters None as the max_iters it meant, a key an older checkpoint lacks as its default."""
    default = TrainConfig.__dataclass_fields__[name].default
    value = saved_train.get(name, default)
    if name == "dataset":
        return dataset_path(value)
    if name == "lr_decay_iters":
        return value or saved_train.get("max_iters")
    return value


def check_kept(given, saved_train):
    """A UsageError of one line where a flag given to --resume would change what the run's steps so far trained
    with (RESUME's KEPT flags); the same value again (sweep.py resumes with the run's own flags) is no change."""
    for name, value in given.items():
        if RESUME.get(name) != KEPT:
            continue
        now, was = dataset_path(value) if name == "dataset" else value, saved_value(saved_train, name)
        if now != was:
            raise UsageError(f"--resume: --{name}={value} differs from the checkpoint's {was}: the run's steps so far "
                             f"trained with --{name}={was}, and a resumed run keeps it (the same losses as an "
                             "uninterrupted run); drop it, or start a new run in another --out_dir")


def resume_changes(saved_train, tc):
    """{flag: [the checkpoint's value, this run's]} of each setting a resume changed (RESUME's EXTENDS and MACHINE
    flags; the KEPT ones it may not change), for the "resumed" event and its line."""
    changed = {name: [saved_value(saved_train, name), getattr(tc, name)] for name, rule in RESUME.items()
               if rule in (EXTENDS, MACHINE)}
    return {name: values for name, values in changed.items() if values[0] != values[1]}


def fit_to_tokenizer(model_cfg, tc, given, resumed):
    """The model config for the tokenizer: the vocabulary padded from the tokenizer's (data.VOCAB_SIZES, what a
    prepared dataset's meta.json holds), unless given or resumed; PowerNorm's warmup from the LR warmup, unless
    given."""
    if tc.seq_warmup_iters and tc.seq_warmup_start > model_cfg.block_size:
        raise UsageError(f"--seq_warmup_start={tc.seq_warmup_start} must be <= --block_size={model_cfg.block_size}")
    vocab = data.VOCAB_SIZES[tc.tokenizer]
    if "vocab_size" in given or resumed:
        if model_cfg.vocab_size < vocab:
            raise UsageError(f"--vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's {vocab}")
    else:
        # a multiple of 64 is faster on GPUs (nanoGPT)
        model_cfg = dataclasses.replace(model_cfg, vocab_size=64 * math.ceil(vocab / 64))
    if model_cfg.pn_warmup is None:
        # PowerNorm App. A.1 sets its psi warmup to the LR warmup (here counted in training forward calls); a
        # ramp has no LR warmup (--warmup_iters has no effect there), so PowerNorm's psi warmup is 0 too
        warmup = 0 if tc.lr_schedule == "ramp" else tc.warmup_iters
        model_cfg = dataclasses.replace(model_cfg, pn_warmup=warmup * tc.grad_accum)
    return model_cfg


def check_data(meta, model_cfg, checkpoint):
    """The prepared data (meta.json) fits the run: long enough for a block, and on --resume the text the run
    started on (the sha256 its checkpoint records; a checkpoint that records none is not checked)."""
    started_on, now = (checkpoint or {}).get("data_sha256"), meta["source"]["sha256"]
    if started_on and started_on != now:
        raise UsageError(f"--resume: the data has changed since the run started ({meta['source']['path']}: text sha256 "
                         f"{now[:12]}, the run trained on {started_on[:12]}); put the run's data back, or start a new "
                         "run in another --out_dir")
    data.check_length(meta, model_cfg.block_size)

"""
A run's configs from its command line, resolved in one place: model.py's GPTConfig (a --preset of presets.py first,
then the explicit flags) and TrainConfig. `resolve` is the whole resolution, as nanoGPT resolves its model_args once:
the flags (from_flags); on --resume the checkpoint's configs with the flags a resume may change on top
(resume_configs); the vocabulary and PowerNorm's warmup (derive_model_flags); and the device, dtype and compile of
this machine (runtime.resolve_device). It reads nothing but its arguments and the machine, so the configs of a run
are known without running it, and a second copy of a rule has no reason to exist. GPTConfig checks its own
combinations; here are the checks of the training flags (each flag declared once, with its range, meaning and source,
as model.flag), RESUME (what a resume may change of a run, flag by flag), the warnings for flags that change nothing,
`check_data`, which holds the prepared data to the configs, and `catalog`, configurable.txt made from the
declarations (`python configs.py > configurable.txt`).
"""

import dataclasses
import math
import os
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional

import torch

import data
from engine import flags
from engine import runtime
from engine import wandb_view
from engine.flags import UsageError
from model import GPT, POSITIVE, GPTConfig, Range, block_layout, flag, out_of_range
from presets import CONTEXTS, PRESETS


DECAYS = ("cosine", "linear")  # the schedules that decay to --min_lr


@dataclass
class TrainConfig:
    """Every training flag: flag(default, meaning, source, ...), as model.GPTConfig's."""
    # data
    dataset: str = flag("builtin", "the corpus: stdlib source, tiny Shakespeare, a local file/dir, or a corpus of "
                                   "the datasets library (Hub name, or local parquet/JSON lines/text)", "data.py",
                        "builtin|shakespeare|PATH|hf:NAME[:CONFIG[:SPLIT]]")
    tokenizer: Literal["byte", "gpt2"] = flag("byte", "byte-level (vocab 256) or GPT-2 BPE via tiktoken", "data.py")
    data_dir: str = flag("data", "where prepared datasets are stored", "data.py", "path")
    batch_size: int = flag(16, "sequences per micro-step on each process", "nanoGPT", POSITIVE)
    grad_accum: int = flag(1, "micro-steps per optimizer step on each process; global batch = batch_size x "
                              "grad_accum x processes", "nanoGPT", POSITIVE)
    # optimizer and schedule
    # AdamW moves each weight by about the LR a step; a float32 weight of 1 (a norm's gain) moves only by more than
    # half its spacing, 2^-24 = 6e-8
    lr: float = flag(4e-3, "peak learning rate", "nanoGPT",
                     Range(1e-7, 1e3, why=" (AdamW moves every weight by about the LR each step; below 1e-7 a "
                           "float32 norm gain of 1 never moves)"))
    # and at most --lr where the schedule decays (check_train_config)
    min_lr: float = flag(4e-4, "learning rate at the end of the decay, at most --lr", "nanoGPT",
                         Range(0, 1e3, why=" (0 decays the LR to 0)"), needs=("lr_schedule", DECAYS))
    warmup_iters: int = flag(50, "steps of linear warmup (a default longer than the run never ends)", "nanoGPT",
                             "int >= 0, <= max_iters when given", needs=("lr_schedule", (*DECAYS, "constant")))
    max_iters: int = flag(800, "optimizer steps of the run", "nanoGPT", POSITIVE)
    lr_decay_iters: Optional[int] = flag(None, "step at which the decay reaches min_lr; a resume keeps the "
                                               "checkpoint's", "nanoGPT", "int >= 1 (>= warmup_iters when given)",
                                         none="max_iters", needs=("lr_schedule", DECAYS))
    lr_schedule: Literal["cosine", "linear", "constant", "ramp"] = flag(
        "cosine", "decay after warmup; ramp: lr*step/max_iters from 0, no warmup/decay",
        "nanoGPT; ramp: NormFormer arXiv v1 Table 3, final Fig. 5, Table 8")
    # AdamW multiplies each weight by 1 - lr * weight_decay a step (0.1 is usual): past 10 it is a typo
    weight_decay: float = flag(0.1, "AdamW decay on matrices (not biases, gains or scales)", "GPT-3",
                               Range(0, 10, why=" (AdamW shrinks each weight by lr x weight_decay a step; 0.1 is "
                                     "usual)"))
    beta1: float = flag(0.9, "AdamW beta1", "GPT-3", Range(0, 1, high_in=False))
    beta2: float = flag(0.99, "AdamW beta2", "nanoGPT (small models)", Range(0, 1, high_in=False))
    # GPT-3 clips at 1.0. A clipped gradient's entries are about grad_clip / sqrt(N): below 1e-3, with N up to 1e9
    # parameters, they fall to AdamW's eps (1e-8)
    grad_clip: float = flag(1.0, "clip the global gradient norm to this; 0: off (the norm is still logged)", "GPT-3",
                            Range(1e-3, off=True, why=" (0 turns clipping off; below 1e-3 the clipped gradient falls "
                                  "to AdamW's eps of 1e-8 and the run learns little or nothing)"))
    # evaluation, logging, checkpoints
    out_dir: str = flag("out", "config.json, log.jsonl and ckpt.pt go here", "nanoGPT", "path")
    eval_interval: int = flag(200, "steps between evaluations (and checkpoints)", "nanoGPT", POSITIVE)
    eval_iters: int = flag(10, "eval_iters x batch_size fixed windows per split (data.eval_starts), shared by the "
                               "processes", "nanoGPT", POSITIVE)
    log_interval: int = flag(25, "steps between progress lines", "nanoGPT", POSITIVE)
    always_save_checkpoint: bool = flag(True, "save at every eval, not only at a new best val loss", "nanoGPT")
    resume: bool = flag(False, "continue exactly from the newest loadable checkpoint in out_dir", "nanoGPT")
    preset: Optional[str] = flag(None, "a paper's row in its model context (presets.py), applied before the other "
                                       "flags", "NormFormer; Spike No More; DeepNet; PowerNorm; Peri-LN; Mix-LN; "
                                       "Curse of Depth; OLMo 2; Magneto; DyT; Gemma 2")
    seed: int = flag(1337, "seeds the init, the batches and dropout", "nanoGPT", Range(0, 2 ** 63, high_in=False))
    overwrite: bool = flag(False, "start afresh in an out_dir that holds a run (deletes it)", "nanonorm")
    tensorboard: bool = flag(False, "TensorBoard event files beside log.jsonl, a view of it (never read back)",
                             "torch.utils.tensorboard")
    # Weights & Biases (engine/wandb_view.py): nanoGPT's wandb_log, wandb_project and wandb_run_name, and the group
    # and tags that show a sweep's arms side by side (sweep.py sets them per run)
    wandb: bool = flag(False, "log to Weights & Biases too, a view of log.jsonl; offline without an API key",
                       "nanoGPT (wandb_log)")
    wandb_project: str = flag(wandb_view.PROJECT, "the W&B project", "nanoGPT",
                              "1-128 characters, none of / \\ # ? % :", needs="wandb")
    wandb_run_name: Optional[str] = flag(None, "the W&B run's name", "nanoGPT", "text",
                                         none="the run folder's name", needs="wandb")
    wandb_group: Optional[str] = flag(None, "the W&B group (sweep.py: the recipe, or the sweep folder's name)", "W&B",
                                      "1-128 characters", none="no group", needs="wandb")
    wandb_tags: Optional[str] = flag(None, "W&B tags beside lr:, seed: and preset: (sweep.py adds recipe:, variant:)",
                                     "W&B", "comma-separated", none="no more", needs="wandb")
    keep_checkpoints: int = flag(1, "keep ckpt-<step>.pt of the last K checkpoints and of the best", "nanonorm",
                                 POSITIVE)
    # loss-spike instruments (diagnostics/instruments.py) and mitigations. Diverged: a non-finite loss or gradient
    # norm, a loss above diverge_loss 3 steps in a row, or the 10-step mean loss diverge_gap above its best; the run
    # then stops before its optimizer step, keeps the last good checkpoint, logs one "diverged" event and exits 3
    diverge_loss: Optional[float] = flag(None, "diverged when the training loss is above this 3 steps in a row",
                                         "nanonorm (its own rule, not NormFormer's)",
                                         Range(math.log(2), why=" (every run starts at about ln(vocabulary) >= ln 2, "
                                               "so a bound below ln 2 is crossed by its first steps)"),
                                         none="first step's loss + 1")
    diverge_gap: float = flag(1.5, "diverged when the 10-step mean loss is this far above its best; 0: off",
                              "nanonorm (a float32 run stalls, it rarely NaNs)", Range(0, why=" (0 turns it off)"))
    spike_window: int = flag(100, "steps in the spike monitor's running mean and std (z NaN before)",
                             "llm.c outlier detector; ZClip", Range(2, why=" (a standard deviation needs two values)"))
    spike_z: float = flag(5.0, "a loss or grad-norm z-score above this is a spike (a \"spike\" event)",
                          "llm.c; llm-foundry KillLossSpike",
                          Range(0, why=" (a z-score: below 0 a step below the window's mean would be a spike)"))
    skip_spikes: bool = flag(False, "skip the optimizer step of a spike (the batch still counts)", "llm.c")
    telemetry_interval: int = flag(0, "a \"telemetry\" event every N steps (grads, acts, logits, gains, psi/nu); "
                                      "0: off", "NormFormer Fig. 3-4; Spike No More §3, Fig. 2-3",
                                   Range(0, why=" (0 turns it off)"))
    fp16_headroom_interval: int = flag(0, "a \"headroom\" event every N steps: max |x| per op/layer vs 65504; 0: off",
                                       "NormFormer arXiv v1 Table 3 (failed operation)",
                                       Range(0, why=" (0 turns it off)"))
    fp16_overflow_fails: bool = flag(False, "diverged at the first step an op output is non-finite or > 65504",
                                     "NormFormer arXiv v1 §4, Table 3 (final: §6, Table 8): runs fail by float16 "
                                     "overflow")
    # PaLM §5 uses 1e-4: at 1 the term weighs as much as the loss it regularizes
    z_loss: float = flag(0.0, "adds z_loss * mean(log Z)^2 to the training loss; the logged loss stays the CE",
                         "PaLM §5; Wortsman et al. 2023 §3.2", Range(0, 1, why=" (0 turns it off; PaLM uses 1e-4)"))
    seq_warmup_iters: int = flag(0, "steps over which the sequence length grows to block_size; 0: off",
                                 "Spike No More §5.2; Li et al. 2022", Range(0, why=" (0 turns it off)"))
    seq_warmup_start: int = flag(8, "sequence length at step 0 of the warmup, at most block_size (batch scaled: same "
                                    "tokens)", "Spike No More §5.2; Li et al. 2022", Range(1),
                                 needs="seq_warmup_iters")
    # system
    device: str = flag("auto", "where to train (auto: cuda if available)", "nanoGPT", "auto|cpu|cuda|cuda:N|mps")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = flag(
        "auto", "autocast precision; auto: bfloat16 on CUDA, float32 on CPU", "nanoGPT")
    # inductor is slower than eager at small shapes on a CPU
    compile: Optional[bool] = flag(None, "torch.compile the model", "PyTorch 2; nanoGPT",
                                   none="True on CUDA, False on CPU")
    # torchrun's own rendezvous waits 600 s for the nodes to join (its join_timeout); a day is past any start-up
    rendezvous_timeout: int = flag(600, "seconds a torchrun process waits for the run's others to join; then one line, "
                                        "exit code 2", "torchrun's join_timeout",
                                   Range(1, 86400, why=" (seconds; a day at most)"))
    gpu_peak_tflops: Optional[float] = flag(None, "dense bf16 peak for the MFU in the progress line (CUDA only)",
                                            "PaLM App. B (MFU); nanoGPT #182",
                                            Range(1e-3, why=" (in TFLOP/s: below 1e-3, 1 GFLOP/s, no GPU is that "
                                                  "slow)"),
                                            none="looked up by GPU name")


CHOICES = {"preset": list(PRESETS)}  # allowed values of the flags whose type does not list them


def parse_flags(argv):
    """{flag: value} of the flags a train.py command line sets."""
    return flags.parse(argv, GPTConfig, TrainConfig, choices=CHOICES)


def model_flags(given):
    """The model flags a command line asks for: its preset's (presets.py), then the explicit ones."""
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
    """What resolve gives: the run's model config, its training config, its device (None without the machine) and
    the checkpoint a --resume continues (None for a fresh run)."""
    model: GPTConfig
    train: TrainConfig
    device: Optional[str]
    checkpoint: Optional[dict] = None


def resolve(given, world_size=1, machine=True, checkpoint_of=None, random_tokens=False):
    """The RunConfigs a run will have, the one resolution of every command that runs or builds a model: the flags
    (from_flags); on --resume the checkpoint that checkpoint_of(the flags' TrainConfig) finds (train.py's reads the
    run folder) with the flags given on top where a resume may change them (resume_configs); the vocabulary and
    PowerNorm's warmup (derive_model_flags); and with machine, --device, --dtype and --compile made concrete on this
    machine (runtime.resolve_device; without it they stay as given, MACHINE_SETTINGS, and the device is None).
    random_tokens: the run feeds random token ids, not the tokenizer's (lab/bench.py), so a --vocab_size below the
    tokenizer's is no error. Bad input is a UsageError of one line. Reads nothing but its arguments and the
    machine."""
    model_cfg, tc = from_flags(given)
    checkpoint = checkpoint_of(tc) if checkpoint_of else None
    if checkpoint:
        model_cfg, tc = resume_configs(given, checkpoint, world_size, tc)
        check_train_config(tc, given)
        tc = absolute_paths(tc)  # a checkpoint's configs may hold relative paths
    model_cfg = derive_model_flags(model_cfg, tc, given, resumed=checkpoint is not None, random_tokens=random_tokens)
    device = None
    if machine:
        device, tc = runtime.resolve_device(tc)
    return RunConfigs(model_cfg, tc, device, checkpoint)


def machine_free(tc, given):
    """tc with MACHINE_SETTINGS as the flags give them (the default "auto" and None where not given), before a
    machine made them concrete: a sweep compares a run's settings with those of runs trained on other machines."""
    defaults = TrainConfig()
    return dataclasses.replace(tc, **{name: given.get(name, getattr(defaults, name)) for name in MACHINE_SETTINGS})


# Flags of the machine, not of the run: a resume takes them from its own command line, not the checkpoint.
SYSTEM_FLAGS = ("out_dir", "device", "dtype", "compile", "overwrite", "resume", "rendezvous_timeout")
# the settings resolve() makes concrete on the machine (runtime.resolve_device) where they are left at the default
MACHINE_SETTINGS = ("dtype", "compile")
LR_RANGE = TrainConfig.__dataclass_fields__["lr"].metadata["allowed"]  # for the scripts with an LR of their own


def check_train_config(tc, given):
    """The training flags' ranges (their declarations in TrainConfig), then the rules between flags. A flag the
    schedule does not read is held to its own range only (no_effect_warnings says it is unused): the default
    --min_lr above a small --lr is no error in a ramp, which never decays."""
    problem = out_of_range(tc)
    if problem:
        raise UsageError(problem)
    decays, warms = tc.lr_schedule in DECAYS, tc.lr_schedule != "ramp"
    ranges = (
        ("min_lr", tc.min_lr <= tc.lr or not decays, f"in [0, --lr={tc.lr}]"),
        # a short test run may leave the default warmup unfinished; an explicit one must fit in the run
        ("warmup_iters", 0 <= tc.warmup_iters and (
            tc.warmup_iters <= tc.max_iters or "warmup_iters" not in given or not warms),
         f"in [0, --max_iters={tc.max_iters}]"),
        ("lr_decay_iters", tc.lr_decay_iters is None or tc.lr_decay_iters >= 1 and (
            tc.lr_decay_iters >= tc.warmup_iters or "lr_decay_iters" not in given or not decays),
         f">= --warmup_iters={tc.warmup_iters} and >= 1, or None"),
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
    if not re.fullmatch(r"[^/\\#?%:]{1,128}", tc.wandb_project):  # W&B's rule for a project's name
        raise UsageError(f"--wandb_project={tc.wandb_project} is not a W&B project name; give 1-128 characters, none "
                         "of / \\ # ? % :")
    if tc.wandb_group is not None and not 1 <= len(tc.wandb_group) <= 128:  # W&B's longest group
        raise UsageError(f"--wandb_group has {len(tc.wandb_group)} characters; give 1-128")
    if not tc.data_dir.strip():
        raise UsageError("--data_dir is empty (it would prepare into the current folder); give a folder for the "
                         "prepared data, such as data")


def dataset_path(dataset):
    """--dataset as a run records it: builtin and shakespeare by name, a path made absolute (an empty one stays
    empty, for data.prepare to refuse), a corpus of the datasets library as data.absolute_streamed writes it."""
    if dataset in ("builtin", "shakespeare") or not dataset.strip():
        return dataset
    return data.absolute_streamed(dataset) if data.is_streamed(dataset) else os.path.abspath(dataset)


def absolute_paths(tc):
    """tc with --dataset and --data_dir absolute: a run resumed from another folder reads the same files."""
    return dataclasses.replace(tc, dataset=dataset_path(tc.dataset), data_dir=os.path.abspath(tc.data_dir))


def no_effect_warnings(given, m, tc, device=None):
    """Flags given on the command line that change nothing in this configuration (a warning, not an error): those
    whose declaration `needs` a setting this run lacks, and the rules below, which depend on more than one flag or on
    the device the run resolved (device; None: not known)."""
    unused = {}
    for config in (m, tc):
        for f in dataclasses.fields(config):
            needs = f.metadata.get("needs")
            if needs is None:
                continue
            other, values = needs if isinstance(needs, tuple) else (needs, None)
            value = getattr(config, other)
            if (value not in values) if values else not value:
                unused[f.name] = f"--{other}={value}"
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
    if device and not device.startswith("cuda"):  # runtime.mfu: the MFU is shown on CUDA only
        unused["gpu_peak_tflops"] = f"--device={device} (the MFU it is the peak of is shown on CUDA only)"
    return [preset_named(f"train.py: warning: --{name} has no effect with {why}", given)
            for name, why in unused.items() if name in given]


def damaged_configs(checkpoint):
    """What is wrong with a checkpoint's model_config or train_config ("train_config.lr=-5.0 must be in [1e-07, 1000]"),
    or None: every value has its flag's type, and the configs pass the checks a command line's flags pass
    (GPTConfig's, check_train_config, derive_model_flags's), with each flag named as the checkpoint's field, not as a
    flag the user never gave. run_folder.read_checkpoint asks it, so a damaged checkpoint is passed over as one
    that does not load; a train_config key that is no flag is left unread."""
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
        derive_model_flags(model_cfg, tc, {}, resumed=True)
    except (ValueError, UsageError) as e:
        return as_fields(str(e))
    return weights_unlike_config(checkpoint["model"], model_cfg)


def weights_unlike_config(weights, model_cfg):
    """What of a checkpoint's weights the model its own model_config makes does not hold, or None: each tensor of the
    name, shape and dtype of GPT(model_config)'s state (built on the meta device: no memory, no time). Weights cast to
    another dtype would be rounded into the model's and resume inexactly, and a model_config edited away from its
    weights was blamed on a flag (use a smaller --block_size) before the weights failed to load."""
    with torch.device("meta"):
        made = GPT(model_cfg).state_dict()
    weights = {name.removeprefix("_orig_mod."): value for name, value in weights.items()}  # a compiled model's
    foreign = sorted(set(weights) - set(made))
    if foreign:
        return f"model.{foreign[0]} is no weight of the model its model_config makes"
    for name, tensor in made.items():
        held = weights.get(name)
        if not isinstance(held, torch.Tensor):
            return f"model.{name} is missing, a weight of the model its model_config makes"
        if held.shape != tensor.shape:
            return f"model.{name} has shape {tuple(held.shape)}, where its model_config makes {tuple(tensor.shape)}"
        if held.dtype != tensor.dtype:
            return (f"model.{name} is {str(held.dtype).removeprefix('torch.')}, where its model_config makes "
                    f"{str(tensor.dtype).removeprefix('torch.')} (a cast copy: a resume would not be exact)")
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
    "overwrite": BOOKKEEPING, "keep_checkpoints": EXTENDS, "tensorboard": EXTENDS,
    "wandb": EXTENDS, "wandb_project": EXTENDS, "wandb_run_name": EXTENDS, "wandb_group": EXTENDS,
    "wandb_tags": EXTENDS,
    # the divergence and spike bounds judge the steps from the resumed one on (docs/guarantees.md)
    "diverge_loss": EXTENDS, "diverge_gap": EXTENDS, "spike_window": EXTENDS, "spike_z": EXTENDS,
    "skip_spikes": KEPT,  # which updates the steps so far skipped
    # the instruments read the run on a separate pass and leave it as it was (diagnostics/instruments.py)
    "telemetry_interval": EXTENDS, "fp16_headroom_interval": EXTENDS, "fp16_overflow_fails": EXTENDS,
    "z_loss": KEPT, "seq_warmup_iters": KEPT, "seq_warmup_start": KEPT,  # the loss and the batches of each step
    "device": MACHINE, "dtype": MACHINE, "compile": MACHINE, "gpu_peak_tflops": EXTENDS,
    "rendezvous_timeout": BOOKKEEPING,  # how long this command's processes wait for each other to start
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


def derive_model_flags(model_cfg, tc, given, resumed, random_tokens=False):
    """The model flags that follow from the training flags where they are not given: the vocabulary, padded from
    the tokenizer's (data.VOCAB_SIZES, what a prepared dataset's meta.json holds; not on resume), and PowerNorm's
    warmup from the LR warmup."""
    if tc.seq_warmup_iters and tc.seq_warmup_start > model_cfg.block_size:
        raise UsageError(f"--seq_warmup_start={tc.seq_warmup_start} must be <= --block_size={model_cfg.block_size}")
    vocab = data.VOCAB_SIZES[tc.tokenizer]
    if "vocab_size" in given or resumed:
        if model_cfg.vocab_size < vocab and not random_tokens:
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


def allowed_text(f, kind):
    """A flag's allowed values as configurable.txt says them, from its declaration and type."""
    kind, optional = flags.plain_type(kind)
    allowed = f.metadata["allowed"]
    choices = flags.allowed_values(f.name, kind, CHOICES)
    if isinstance(allowed, Range):
        text = f"{kind.__name__} {allowed.text()}"
    elif allowed:
        text = allowed
    elif f.name in CHOICES:
        text = "a preset below"
    else:
        text = "|".join(choices) if choices else kind.__name__
    none = f.metadata["none"]
    return f"{text}, or None (= {none})" if optional and none else f"{text}, or None" if optional else text


def needs_text(needs):
    """A declaration's `needs` as words: "only with --scale_heads", "only with --norm=batchnorm|pnv|powernorm"."""
    if needs is None:
        return ""
    other, values = needs if isinstance(needs, tuple) else (needs, None)
    return f"; only with --{other}={'|'.join(values)}" if values else f"; only with --{other}"


def catalog_lines(config_class):
    """Two or more lines per flag of a config class: name, default and allowed values; then meaning (source)."""
    kinds = typing.get_type_hints(config_class)
    lines = []
    for f in dataclasses.fields(config_class):
        head = f"{f.name:<24}{str(f.default):<13}{allowed_text(f, kinds[f.name])}"
        lines += textwrap.wrap(head, 120, subsequent_indent=" " * 37)
        meaning = f"{f.metadata['meaning']}{needs_text(f.metadata['needs'])} [{f.metadata['source']}]"
        lines += textwrap.wrap(meaning, 120, initial_indent="    ", subsequent_indent="    ")
    return lines


def catalog():
    """configurable.txt: every flag of train.py from its declaration, then the presets (presets.py)."""
    about = ("nanonorm's flags: every --flag of train.py, as `python train.py --help` prints them. Generated from "
             "their "
             "declarations (model.GPTConfig, configs.TrainConfig, presets.py) by `python configs.py > "
             "configurable.txt`; tests/test_configurable.py fails when it is stale. A float flag must be finite.")
    lines = [*textwrap.wrap(about, 118, initial_indent="# ", subsequent_indent="# "),
             f"# {'flag':<22}{'default':<13}allowed", "#     meaning [source]", "",
             "# model flags (model.GPTConfig)", *catalog_lines(GPTConfig), "",
             "# training flags (configs.TrainConfig)", *catalog_lines(TrainConfig), "",
             "# presets: --preset=NAME sets these model flags first; explicit flags override (an ablation is a preset",
             "# plus an override). Each group is one model context: compare a variant only with its group's baseline."]
    for context, group in CONTEXTS.items():
        lines += ["", *textwrap.wrap(context, 118, initial_indent="# ", subsequent_indent="# ")]
        for name, preset in group.items():
            settings = " ".join(f"{k}={v}" for k, v in preset.items()) or "(none)"
            lines += textwrap.wrap(f"{'preset=' + name:<28}{settings}", 120, subsequent_indent=" " * 28)
            lines += textwrap.wrap(preset.source, 120, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"


def main(argv):
    """`python configs.py`: the catalog on stdout, configurable.txt's text; it takes no arguments."""
    if flags.wants_help(argv):
        print(main.__doc__)
        return 0
    if argv:
        return flags.fail("configs.py", f"{argv[0]} is not taken: configs.py takes no arguments; run "
                                        "python configs.py > configurable.txt")
    sys.stdout.write(catalog())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

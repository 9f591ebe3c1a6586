"""
Train a nanonorm GPT. One process:
    python train.py --norm=rmsnorm
One node, any number of processes (DDP; nccl on CUDA, gloo on CPU):
    torchrun --standalone --nproc_per_node=8 train.py --preset=normformer --compile
Flags are --key=value (or --key value); a bare --flag sets a boolean. configurable.txt lists them all.
A run writes out_dir/config.json (the resolved config), out_dir/log.jsonl (one JSON object per event)
and out_dir/ckpt.pt (atomically, at each eval); --resume continues from it exactly.
python train.py --help lists every flag (from configurable.txt).
"""

import contextlib
import ctypes
import dataclasses
import difflib
import hashlib
import json
import math
import os
import platform
import signal
import sys
import time
import typing
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.distributed as dist
# Imported before init_process_group on purpose: torch.distributed.nn binds group.WORLD as a default argument when
# first imported, and DDP imports it (through torch._dynamo). Imported after, it pins the group for good, so
# destroy_process_group leaves gloo's threads running into the interpreter's exit, where they can abort it
# ("terminate called without an active exception": once in a CI run). Imported first, it binds None.
import torch.distributed.nn  # noqa: F401
from torch.nn.parallel import DistributedDataParallel as DDP

import data
import stability
from model import GPT, GPTConfig, PRESETS, flops_per_token


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
    eval_iters: int = 10
    log_interval: int = 25
    always_save_checkpoint: bool = True
    resume: bool = False
    preset: Optional[str] = None
    seed: int = 1337
    overwrite: bool = False  # start afresh in an out_dir that holds a run
    keep_checkpoints: int = 1  # ckpt-<step>.pt of the last K checkpoints, and of the best
    # loss-spike instruments (stability.py) and mitigations
    diverge_loss: Optional[float] = None  # diverged above this loss 3 steps in a row; None: first loss + 1
    diverge_gap: float = 1.5  # diverged when the 10-step mean loss is this far above its best; 0: off
    spike_window: int = 100  # steps in the spike monitor's running mean and std
    spike_z: float = 5.0  # a loss or grad-norm z-score above this is a spike
    skip_spikes: bool = False  # skip the optimizer step of a spike (llm.c)
    telemetry_interval: int = 0  # a "telemetry" event every N steps; 0: off
    fp16_headroom_interval: int = 0  # a "headroom" event (max |x| per op and layer) every N steps; 0: off
    z_loss: float = 0.0  # adds z_loss * mean(log Z)^2 to the training loss (PaLM)
    seq_warmup_iters: int = 0  # steps over which the sequence length grows to block_size; 0: off
    seq_warmup_start: int = 8  # the sequence length at step 0 of the sequence-length warmup
    # system
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    compile: Optional[bool] = None  # None: on CUDA, off on CPU (where inductor is slower at small shapes)
    gpu_peak_tflops: Optional[float] = None  # for MFU; None: looked up by GPU name


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def flag_types():
    """Every flag's name -> (the dataclass that owns it, its type)."""
    hints = {**typing.get_type_hints(GPTConfig), **typing.get_type_hints(TrainConfig)}
    owners = {f.name: GPTConfig for f in dataclasses.fields(GPTConfig)}
    owners.update({f.name: TrainConfig for f in dataclasses.fields(TrainConfig)})
    return {name: (owner, hints[name]) for name, owner in owners.items()}


def allowed_values(name, kind):
    """The values a flag accepts, as a list, or None where any value of its type goes."""
    if name == "preset":
        return list(PRESETS)
    if typing.get_origin(kind) is Literal:
        return list(typing.get_args(kind))
    return None


def convert(name, text, kind):
    """Turn the text of --name=text into a value of the field's type, or explain what is allowed."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union and type(None) in args:  # Optional[X]
        if text == "None":
            return None
        kind = next(a for a in args if a is not type(None))
    choices = allowed_values(name, kind)
    if choices is not None:
        if text not in choices:
            raise UsageError(f"--{name}={text} is not allowed; choose one of {', '.join(choices)}")
        return text
    if kind is bool:
        lowered = text.lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise UsageError(f"--{name}={text} is not a boolean; use True or False")
        return lowered in ("true", "1", "yes")
    try:
        return kind(text)
    except ValueError:
        raise UsageError(f"--{name}={text} is not a valid {kind.__name__}") from None


def parse_flags(argv):
    """--key=value, --key value, or a bare --key for True. Returns {name: value} of the flags given."""
    types = flag_types()
    given, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}; flags look like --key=value")
        name, has_value, text = arg[2:].partition("=")
        if name not in types:
            close = difflib.get_close_matches(name, list(types), n=3)
            hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
            raise UsageError(f"unknown flag --{name}{hint} (configurable.txt lists every flag)")
        kind = types[name][1]
        if not has_value:
            next_is_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            if kind in (bool, Optional[bool]) and not next_is_value:
                text = "True"
            elif next_is_value:
                text, i = argv[i + 1], i + 1
            else:
                raise UsageError(f"--{name} needs a value (--{name}=VALUE)")
        given[name] = convert(name, text, kind)
        i += 1
    return given


def print_help():
    """The flags as configurable.txt lists them (the one source of the names, defaults and meanings)."""
    print(__doc__.strip())
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configurable.txt")) as f:
        lines = f.read().splitlines()[2:]  # the first two lines say how the file is checked
    print("\n".join(lines))


def model_flags(given):
    """The model flags a command line asks for: its preset's (model.PRESETS), then the explicit ones."""
    model_args = dict(PRESETS[given["preset"]]) if given.get("preset") else {}
    model_args.update({k: v for k, v in given.items() if k in GPTConfig.__dataclass_fields__})
    return model_args


def build_configs(given):
    """The preset first, then the explicit flags; config-time checks give one line."""
    for name, value in given.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{name}={value} is not a finite number")
    train_args = {k: v for k, v in given.items() if k in TrainConfig.__dataclass_fields__}
    try:
        return GPTConfig(**model_flags(given)), TrainConfig(**train_args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_train_config(tc, given):
    positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval",
                "keep_checkpoints")
    for name in positive:
        if getattr(tc, name) < 1:
            raise UsageError(f"--{name}={getattr(tc, name)} must be a positive integer")
    ranges = (
        ("lr", tc.lr > 0, "> 0"),
        ("min_lr", 0 <= tc.min_lr <= tc.lr, f"in [0, --lr={tc.lr}]"),
        # a short test run may leave the default warmup unfinished; an explicit one must fit in the run
        ("warmup_iters", 0 <= tc.warmup_iters and (tc.warmup_iters <= tc.max_iters or "warmup_iters" not in given),
         f"in [0, --max_iters={tc.max_iters}]"),
        ("lr_decay_iters", tc.lr_decay_iters is None or tc.lr_decay_iters >= 1 and (
            tc.lr_decay_iters >= tc.warmup_iters or "lr_decay_iters" not in given),
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
    if tc.device != "auto" and tc.device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device={tc.device} is not a device; choose auto, cpu, cuda, cuda:N or mps")
    if not tc.out_dir.strip():
        raise UsageError("--out_dir is empty; give a folder for config.json, log.jsonl and checkpoints")


def check_out_dir(out_dir):
    """out_dir is a folder, or can become one, and can be written: checked before anything is written."""
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out_dir={out_dir}: {existing} is a file, not a folder; choose another --out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out_dir={out_dir}: {existing} is not writable; choose another --out_dir")


def holds_a_run(out_dir):
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    return [n for n in sorted(names) if n == "log.jsonl" or (n.startswith("ckpt") and n.endswith(".pt"))]


def no_effect_warnings(given, m, tc):
    """Flags given on the command line that change nothing in this configuration (a warning, not an error)."""
    by_norm = {"pn_alpha_fwd": ("batchnorm", "pnv", "powernorm"), "pn_alpha_bwd": ("powernorm",),
               "pn_warmup": ("powernorm",), "pn_group_scaling": ("powernorm",)}
    unused = {name: f"--norm={m.norm}" for name, norms in by_norm.items() if m.norm not in norms}
    if m.norm == "none":
        unused.update(norm_eps="--norm=none", norm_affine="--norm=none")
    if not m.scale_resids:
        unused["scale_resids_init"] = "--scale_resids=False"
    if not m.layer_scale:
        unused["layer_scale_init"] = "--layer_scale=False"
    if tc.lr_schedule in ("constant", "ramp"):
        unused.update(min_lr=f"--lr_schedule={tc.lr_schedule}", lr_decay_iters=f"--lr_schedule={tc.lr_schedule}")
    if tc.lr_schedule == "ramp":
        unused["warmup_iters"] = "--lr_schedule=ramp"
    if not tc.seq_warmup_iters:
        unused["seq_warmup_start"] = "--seq_warmup_iters=0"
    return [f"train.py: warning: --{name} has no effect with {why}" for name, why in unused.items() if name in given]


def get_lr(step, tc):
    """Linear warmup to --lr, then cosine or linear decay to --min_lr at lr_decay_iters (or constant).
    ramp: NormFormer §4's LR stability test, lr * step / max_iters from 0, no warmup and no decay (Table 8:
    0 to 0.1 over 1,000 steps), run until the loss diverges."""
    if tc.lr_schedule == "ramp":
        return tc.lr * step / tc.max_iters
    if step < tc.warmup_iters:
        return tc.lr * (step + 1) / (tc.warmup_iters + 1)
    decay_iters = tc.lr_decay_iters or tc.max_iters
    if tc.lr_schedule == "constant" or decay_iters <= tc.warmup_iters:
        return tc.lr
    ratio = min(1.0, (step - tc.warmup_iters) / (decay_iters - tc.warmup_iters))
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if tc.lr_schedule == "cosine" else 1.0 - ratio
    return tc.min_lr + coeff * (tc.lr - tc.min_lr)


def sequence_shape(step, tc, block_size):
    """(sequence length, sequences per micro-step) at this step. Sequence-length warmup (Spike No More §5.2;
    Li et al. 2022, "The Stability-Efficiency Dilemma"): the length grows linearly from seq_warmup_start to
    block_size over seq_warmup_iters steps, and the batch grows as the length shrinks, so the tokens per step
    stay batch_size * block_size (to within one sequence). A function of the step alone: resume is exact."""
    if step >= tc.seq_warmup_iters:
        return block_size, tc.batch_size
    length = tc.seq_warmup_start + (block_size - tc.seq_warmup_start) * step // tc.seq_warmup_iters
    return length, tc.batch_size * block_size // length


def z_loss_term(logits):
    """mean(log Z)^2, Z the softmax normalizer of each token's logits (PaLM §5, Chowdhery et al. 2022;
    Wortsman et al. 2023 §3.2): added to the loss times --z_loss, it keeps log Z near 0 and stops the output
    logits from drifting to magnitudes where the softmax loses precision."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def format_duration(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"


def batch_generator(*stream):
    """A fresh generator per batch, seeded from (seed, rank, step, micro-step). The batches of a step are
    then a function of the step alone, so the step is the data position a checkpoint needs to resume.
    sha256, not hash(): the same seeds on every machine and Python version."""
    digest = hashlib.sha256(repr(stream).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


# float16: a run whose gradients overflow even with the loss scaled below this has diverged (fairseq's
# --min-loss-scale default, the code NormFormer trained with)
MIN_LOSS_SCALE = 1e-4

EVAL_STREAM = -1  # in place of the step: eval batches are the same at every eval, and differ from training's


def configure_optimizer(model, tc, device_type):
    """AdamW; weight decay on matrices only, not on biases, norm gains or per-channel scales."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device_type in ("cuda", "cpu")  # fused AdamW kernels exist for both in torch >= 2.4
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=fused)


class CheckpointError(Exception):
    """A checkpoint could not be written: printed as one line, exit code 1."""


def pause_for_tests(point):
    """test_resume.py SIGKILLs a run paused here (NANONORM_PAUSE_AT=step@5, eval@6 or save@6) mid-operation."""
    if os.environ.get("NANONORM_PAUSE_AT") == point:
        print(f"paused at {point}", flush=True)
        time.sleep(60)


def write_atomically(path, state):
    """Write to path.tmp, flush it to the disk, then rename it over path: a crash or a kill at any moment
    leaves the old file or the new one, never half of one; a failed write removes the partial tmp."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        pause_for_tests(f"save@{state['step']}")
        os.replace(tmp, path)
        folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself reaches the disk
        finally:
            os.close(folder)
    except (OSError, RuntimeError) as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        cause = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise CheckpointError(f"cannot write {path} ({cause}); the previous checkpoint is kept") from None


def numbered_checkpoints(out_dir):
    """{step: path} of the ckpt-<step>.pt files in out_dir."""
    found = {}
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        stem = name.removeprefix("ckpt-").removesuffix(".pt")
        if name.startswith("ckpt-") and name.endswith(".pt") and stem.isdigit():
            found[int(stem)] = os.path.join(out_dir, name)
    return found


def save_checkpoint(out_dir, state, keep):
    """ckpt.pt is the newest checkpoint; ckpt-<step>.pt (a hard link, no extra space) names each of the last
    `keep` ones and the one with the best val loss; older ones are deleted."""
    newest = os.path.join(out_dir, "ckpt.pt")
    write_atomically(newest, state)
    numbered = os.path.join(out_dir, f"ckpt-{state['step']}.pt")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.remove(numbered + ".tmp")
        os.link(newest, numbered + ".tmp")
        os.replace(numbered + ".tmp", numbered)
    except OSError:
        write_atomically(numbered, state)  # a file system without hard links
    steps = sorted(numbered_checkpoints(out_dir).items())
    for step, path in steps[:-keep]:
        if step != state["best_step"]:
            os.remove(path)


CHECKPOINT_KEYS = ("model", "optimizer", "scaler", "step", "best_val", "rng", "model_config", "train_config")


def read_checkpoint(path):
    """A nanonorm checkpoint, or UsageError saying why path is not one."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"cannot read {path} ({type(e).__name__}); it is damaged or not a checkpoint") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    if missing:
        raise UsageError(f"{path} is not a nanonorm checkpoint (it lacks {', '.join(missing)})")
    return checkpoint


def newest_checkpoint(out_dir):
    """The newest checkpoint that loads: ckpt.pt, else the ckpt-<step>.pt files from the newest down."""
    newest = os.path.join(out_dir, "ckpt.pt")
    candidates = [newest] if os.path.exists(newest) else []
    for _, path in sorted(numbered_checkpoints(out_dir).items(), reverse=True):
        if not candidates or not os.path.samefile(path, newest):
            candidates.append(path)
    if not candidates:
        raise UsageError(f"--resume: no checkpoint in {out_dir} (start without --resume to train from scratch)")
    problems = []
    for path in candidates:
        try:
            checkpoint = read_checkpoint(path)
        except UsageError as e:
            problems.append(str(e))
            continue
        for problem in problems:
            print(f"train.py: note: {problem}; resuming from {path}", file=sys.stderr)
        return checkpoint
    raise UsageError(f"--resume: {problems[0]}" + (f" (and {len(problems) - 1} older ones)" if problems[1:] else ""))


def gather_rng_states(world_size):
    """Every process's RNG states (dropout draws from them), so a resume continues each one exactly."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    if world_size == 1:
        return [state]
    states = [None] * world_size
    dist.all_gather_object(states, state)
    return states


def rank_spread(model):
    """How far the processes' weights and buffers have drifted apart: DDP keeps them identical, so anything
    but 0 means a bug (an unsynchronized buffer, a gradient that skipped the all-reduce)."""
    sums = torch.stack([t.detach().double().sum() for t in [*model.parameters(), *model.buffers()]]).tolist()
    gathered = [None] * dist.get_world_size()
    # a list of Python floats per process, gathered as one object: one call, whatever the backend and device
    dist.all_gather_object(gathered, sums)
    return max(abs(theirs - ours) for other in gathered for theirs, ours in zip(other, sums, strict=True))


def ddp_device(device_type, local_rank, local_world_size):
    """This torchrun process's device and process-group backend. NCCL takes one process per GPU; with more
    processes than GPUs (torchrun --nproc_per_node=2 on one GPU, to try DDP) they share the GPUs in turn, and
    gloo, which copies CUDA tensors through host memory, carries their collectives."""
    if device_type != "cuda":
        return device_type, "gloo"
    gpus = torch.cuda.device_count()
    return f"cuda:{local_rank % gpus}", "nccl" if local_world_size <= gpus else "gloo"


def log_event(path, event):
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def resolve_device(tc):
    """--device=auto and --dtype=auto made concrete: returns the device and tc with its dtype resolved."""
    device = tc.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = device.split(":")[0]
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device={tc.device}: CUDA is not available here; use --device=cpu")
    if device_type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device={tc.device}: this torch has no MPS device; use --device=cpu")
    if tc.dtype == "auto":
        # CPUs without bf16 units run bf16 autocast 20-30x slower than float32 (measured on the CI machine)
        bf16_ok = device_type == "cuda" and torch.cuda.is_bf16_supported()
        tc = dataclasses.replace(tc, dtype="bfloat16" if bf16_ok else "float32")
    if tc.dtype == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--dtype=bfloat16 is not supported by this GPU; use --dtype=float16")
    if tc.compile is None:
        # measured: inductor beats eager on GPUs, but on a 2-core CPU at the quickstart shape it was slower
        tc = dataclasses.replace(tc, compile=device_type == "cuda")
    return device, tc


def keep_freed_memory():
    """Make glibc keep the memory a CPU training step frees, for the next step to reuse. Returns whether it could.

    Each step allocates and frees every activation. By default glibc serves large blocks with mmap and gives them
    back to the OS on free, so each new tensor page-faults on first touch: measured 476-5,700 faults a step at
    the quickstart shape and 36,000-71,000 at 2L/768d/T1024, batch 4. Never trimming the heap
    (M_TRIM_THRESHOLD = -1) and never using mmap (M_MMAP_MAX = 0) stops that; the process then holds its peak
    memory. Trimming off alone is worse: it also freezes glibc's adaptive mmap threshold at 128 KiB. Not glibc
    (macOS, musl): nothing to do.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_TRIM_THRESHOLD, -1)) and bool(libc.mallopt(M_MMAP_MAX, 0))


# Dense bf16 peak of common GPUs, FLOP/s (vendor datasheets, without sparsity). MFU = achieved model FLOP/s over
# this peak (PaLM App. B); nanoGPT issue #182: a hard-coded A100 peak gives wrong MFU on any other GPU. The first
# key found in the device's name wins, so a name that holds another ("H100 NVL" holds "H100") comes before it.
GPU_PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12),
                 ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("A10", 125e12), ("RTX 4090", 165e12),
                 ("RTX 3090", 71e12))


def describe_device(device):
    """The device as the progress output names it: with the GPU's model, so that timings say where they ran."""
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else device


def gpu_peak_flops(tc, device):
    """The peak used for MFU on this GPU, or None where it is not known (then MFU is not printed)."""
    if tc.gpu_peak_tflops:
        return tc.gpu_peak_tflops * 1e12
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_BF16 if key in name), None)


# Flags of the machine, not of the run: a resume takes them from its own command line, not the checkpoint.
SYSTEM_FLAGS = ("out_dir", "device", "dtype", "compile", "overwrite", "resume")


def resume_configs(given, checkpoint, world_size):
    """The checkpoint's model and training config, with the flags given on top where a resume can change
    them; an inconsistent resume is one line."""
    saved_model, saved_train = checkpoint["model_config"], checkpoint["train_config"]
    step = checkpoint["step"]
    changed = [k for k, v in model_flags(given).items() if saved_model.get(k, v) != v]
    if given.get("preset") not in (None, saved_train.get("preset")):
        changed.insert(0, "preset")
    if changed:
        raise UsageError(f"--resume: {', '.join('--' + k for k in changed)} differ from the checkpoint's; a "
                         "resumed run keeps its model (use another --out_dir for a new one)")
    for name in ("dataset", "tokenizer"):
        if name in given and given[name] != saved_train.get(name):
            raise UsageError(f"--resume: --{name}={given[name]} differs from the checkpoint's "
                             f"{saved_train.get(name)}; a resumed run keeps its data")
    if len(checkpoint["rng"]) != world_size:
        raise UsageError(f"--resume: the checkpoint was written by {len(checkpoint['rng'])} processes, this run has "
                         f"{world_size}; exact resume needs the same number (torchrun --nproc_per_node)")
    try:
        model_cfg = GPTConfig(**saved_model)
        known = {k: v for k, v in saved_train.items() if k in TrainConfig.__dataclass_fields__}
        known.update(lr_decay_iters=known.get("lr_decay_iters") or known.get("max_iters"))
        known.update({k: getattr(TrainConfig, k) for k in SYSTEM_FLAGS})
        tc = dataclasses.replace(TrainConfig(**known), **{k: v for k, v in given.items()
                                                          if k in TrainConfig.__dataclass_fields__})
    except (TypeError, ValueError) as e:
        raise UsageError(f"--resume: the checkpoint's config is not nanonorm's ({e})") from None
    if tc.max_iters <= step:
        raise UsageError(f"--resume: the checkpoint is at step {step} and --max_iters={tc.max_iters}; to train on, "
                         f"raise --max_iters (the LR keeps its schedule to --lr_decay_iters={tc.lr_decay_iters})")
    return model_cfg, tc


def setup(argv):
    """Everything that can fail on bad input, before any work: flags, DDP, device, data, model config."""
    given = parse_flags(argv)
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    model_cfg, tc = build_configs(given)
    check_train_config(tc, given)
    check_out_dir(tc.out_dir)
    checkpoint = None
    if tc.resume:
        checkpoint = newest_checkpoint(tc.out_dir)
        model_cfg, tc = resume_configs(given, checkpoint, world_size)
        check_train_config(tc, given)
    elif holds_a_run(tc.out_dir) and not tc.overwrite:
        raise UsageError(f"--out_dir={tc.out_dir} holds a run ({', '.join(holds_a_run(tc.out_dir))}); continue it "
                         "with --resume, replace it with --overwrite, or choose another --out_dir")
    device, tc = resolve_device(tc)
    device_type = device.split(":")[0]
    gpus = 0
    if device_type == "cuda":
        # the GPUs this run uses, for MFU: one per process, or every GPU of each node when processes share them
        gpus = world_size // local_world_size * min(local_world_size, torch.cuda.device_count())
    if ddp:
        device, backend = ddp_device(device_type, local_rank, local_world_size)
        if device_type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    if device_type == "cpu":
        # torchrun sets OMP_NUM_THREADS=1 per process: give each process its share of the cores instead
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_world_size))
        keep_freed_memory()
    # every process asks: data.prepare's file lock lets one process per disk tokenize while the others wait
    folder = data.prepare(tc.dataset, tc.tokenizer, tc.data_dir)
    meta = data.load_meta(folder)
    data.check_length(meta, model_cfg.block_size)
    if tc.seq_warmup_iters and tc.seq_warmup_start > model_cfg.block_size:
        raise UsageError(f"--seq_warmup_start={tc.seq_warmup_start} must be <= --block_size={model_cfg.block_size}")
    padded_vocab = 64 * math.ceil(meta["vocab_size"] / 64)  # a multiple of 64 is faster on GPUs (nanoGPT)
    if "vocab_size" in given or checkpoint:
        if model_cfg.vocab_size < meta["vocab_size"]:
            raise UsageError(f"--vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's {meta['vocab_size']}")
    else:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=padded_vocab)
    if model_cfg.pn_warmup is None:
        # PowerNorm App. A.1 warms psi up; its warmup defaults to the LR warmup, counted in training forward calls
        model_cfg = dataclasses.replace(model_cfg, pn_warmup=tc.warmup_iters * tc.grad_accum)
    if rank == 0:
        for warning in no_effect_warnings(given, model_cfg, tc):
            print(warning, file=sys.stderr)
    return dict(model_cfg=model_cfg, tc=tc, checkpoint=checkpoint, folder=folder, meta=meta, ddp=ddp, rank=rank,
                world_size=world_size, device=device, device_type=device_type, gpus=gpus)


def restore(checkpoint, model, optimizer, scaler, tc, rank, device_type):
    """A checkpoint's state into the fresh model, optimizer, scaler and RNGs; returns (step, best_val, best_step)."""
    # nanoGPT issue #325: a compiled module's state_dict prefixes every name with _orig_mod.
    weights = {k.removeprefix("_orig_mod."): v for k, v in checkpoint["model"].items()}
    try:
        model.load_state_dict(weights)
        optimizer.load_state_dict(checkpoint["optimizer"])
        rng = checkpoint["rng"][rank]
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and device_type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise UsageError(f"--resume: the checkpoint does not fit its own model ({str(e).splitlines()[0]})") from None
    saved_dtype = checkpoint["train_config"].get("dtype")
    if scaler.is_enabled() and checkpoint["scaler"]:
        scaler.load_state_dict(checkpoint["scaler"])
    elif saved_dtype != tc.dtype and rank == 0:
        # dtype is the machine's choice (a resume may move to a GPU), so allowed, but it is a new numeric path
        print(f"train.py: note: the checkpoint was trained in {saved_dtype}, this run uses {tc.dtype}"
              f"{' with a fresh GradScaler' if scaler.is_enabled() else ''}; not an exact continuation", file=sys.stderr)
    return checkpoint["step"], checkpoint["best_val"], checkpoint.get("best_step", checkpoint["step"])


def start_log(log_path, resumed_step):
    """A new run starts a new log. A resumed one keeps its events up to the checkpoint's step: the steps
    after it (logged before a crash or a kill) are trained again and logged again."""
    kept = []
    if resumed_step is not None and os.path.exists(log_path):
        with open(log_path) as f:
            for line in f:
                with contextlib.suppress(ValueError):  # a line torn by a kill
                    if json.loads(line).get("step", 0) <= resumed_step:
                        kept.append(line)
    with open(log_path + ".tmp", "w") as f:
        f.writelines(kept)
    os.replace(log_path + ".tmp", log_path)


class StopRequest:
    """The first Ctrl-C (SIGINT), or a SIGTERM (what torchrun sends its workers on Ctrl-C), asks the run to
    stop at the next step boundary with a checkpoint; a second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


def agree(flag, ddp, device):
    """True on every process if it is True on any (a failed checkpoint write), so all stop together."""
    if not ddp:
        return flag
    flag = torch.tensor(float(flag), device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def train(model_cfg, tc, checkpoint, folder, meta, ddp, rank, world_size, device, device_type, gpus, stop):
    master = rank == 0
    micro_steps = tc.grad_accum
    os.makedirs(tc.out_dir, exist_ok=True)
    log_path = os.path.join(tc.out_dir, "log.jsonl")
    torch.manual_seed(tc.seed)  # the same initial weights on every process
    model = GPT(model_cfg).to(device)
    optimizer = configure_optimizer(model, tc, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=tc.dtype == "float16")
    step, best_val, best_step = 0, float("inf"), 0
    monitor = stability.SpikeMonitor(tc.spike_window, tc.spike_z)
    divergence = stability.DivergenceCheck(tc.diverge_loss, gap=tc.diverge_gap)
    torch.manual_seed(tc.seed + rank)  # dropout differs between processes
    if checkpoint:
        step, best_val, best_step = restore(checkpoint, model, optimizer, scaler, tc, rank, device_type)
        # a resumed run flags, skips and diverges exactly where the uninterrupted one would
        monitor.load_state_dict(checkpoint.get("spike_monitor", monitor.state_dict()))
        divergence.load_state_dict(checkpoint.get("divergence", divergence.state_dict()))
    sequences = tc.batch_size * tc.grad_accum * world_size
    global_batch = {"sequences": sequences, "tokens": sequences * model_cfg.block_size}
    if master:
        if tc.overwrite and not checkpoint:
            for name in holds_a_run(tc.out_dir):
                os.remove(os.path.join(tc.out_dir, name))
        start_log(log_path, step if checkpoint else None)
        with open(os.path.join(tc.out_dir, "config.json"), "w") as f:
            json.dump({"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(tc),
                       "world_size": world_size, "global_batch": global_batch, "data": meta,
                       "torch": torch.__version__}, f, indent=2)
        print(f"{model.num_params():,} parameters | data {folder} | unigram entropy of val "
              f"{meta['unigram_entropy']:.4f} nats/token | device {describe_device(device)} {tc.dtype} x{world_size} "
              f"| global batch {sequences} sequences = {tc.batch_size} x {tc.grad_accum} micro-steps x {world_size} "
              f"processes, {global_batch['tokens']:,} tokens")
        if checkpoint and tc.lr_schedule != "constant" and tc.max_iters > tc.lr_decay_iters > tc.warmup_iters:
            print(f"resumed at step {step}: the LR stays at --min_lr={tc.min_lr} after --lr_decay_iters="
                  f"{tc.lr_decay_iters} (the checkpoint's schedule); raise --lr_decay_iters to decay over the longer run")
    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)
    eval_model = model.module if ddp else model  # compiled if --compile; no DDP wrapper, as nothing syncs
    autocast = torch.autocast(device_type, dtype=getattr(torch, tc.dtype), enabled=tc.dtype != "float32")

    def get_batch(split, *stream, shape=(model_cfg.block_size, tc.batch_size)):
        length, batch = shape
        return data.get_batch(folder, split, batch, length, batch_generator(tc.seed, rank, *stream), device)

    @torch.no_grad()
    def evaluate():
        """Mean loss over eval_iters fixed batches per split and process, in eval mode (running statistics)."""
        if ddp:
            # running statistics are per process; rank 0's win, as DDP's own broadcast does
            for buffer in raw_model.buffers():
                dist.broadcast(buffer, src=0)
        model.eval()
        losses = {}
        for split in ("train", "val"):
            total = torch.zeros((), device=device)
            for i in range(tc.eval_iters):
                x, y = get_batch(split, EVAL_STREAM, i)
                with autocast:
                    total += eval_model(x, y)[1].float()
                pause_for_tests(f"eval@{step}")
            if ddp:
                dist.all_reduce(total)
            losses[split] = total.item() / (tc.eval_iters * world_size)
        model.train()
        return losses

    def save(step):
        """A checkpoint of this step on disk, or CheckpointError on every process."""
        rng_states = gather_rng_states(world_size)
        failure = None
        if master:
            try:
                save_checkpoint(tc.out_dir, {
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "step": step, "best_val": best_val, "best_step": best_step,
                    "rng": rng_states, "spike_monitor": monitor.state_dict(), "divergence": divergence.state_dict(),
                    "model_config": dataclasses.asdict(model_cfg),
                    "train_config": dataclasses.asdict(tc)}, tc.keep_checkpoints)
            except CheckpointError as e:
                failure = str(e)
        if agree(failure is not None, ddp, device):
            raise CheckpointError(failure or "process 0 could not write the checkpoint")
        return step

    points = raw_model.probe_points()  # the papers' op names for the hooks of stability.py
    persistent = raw_model.state_dict().keys()
    # running statistics change in a step's forward/backward; they are put back before forensics re-runs it
    stateful = any(name in persistent for name, _ in raw_model.named_buffers())

    def probe_pass(x, y, backward):
        """The probes' own forward (and backward) of a batch on the plain model (hooks see nothing inside
        torch.compile), leaving the weights, buffers, gradients and RNG as they were."""
        saved = stability.snapshot(raw_model, parameters=False)
        with torch.random.fork_rng(devices=[device] if device_type == "cuda" else []):
            with stability.Probe(raw_model, points, backward=backward, stats=True) as probe:
                with autocast:
                    logits, loss = raw_model(x, y)
                if backward:
                    loss.backward()
        raw_model.zero_grad(set_to_none=True)
        stability.restore(raw_model, saved)
        return probe.records, logits.detach()

    def telemetry(step, x, y, weights):
        """One "telemetry" and/or "headroom" event from a hooked pass over the step's last micro-batch."""
        headroom = bool(tc.fp16_headroom_interval) and step % tc.fp16_headroom_interval == 0
        records, logits = probe_pass(x, y, backward=headroom)
        if headroom:
            log_event(log_path, {"event": "headroom", "step": step, "ops": stability.headroom(records),
                                 "fp16_max": stability.FP16_MAX})
        if weights is not None:
            forward = [r for r in records if r["pass"] == "forward"]
            log_event(log_path, {
                "event": "telemetry", "step": step, "weights": weights,
                "acts": [{k: r[k] for k in ("layer", "op", "std", "max_abs")} for r in forward],
                "attn_logit_max": [{"layer": r["layer"], "value": r["max_abs"]} for r in forward if r["op"] == "q@k"],
                "logits": stability.logit_stats(logits),
                "gains": stability.gain_stats(raw_model, label=raw_model.op_label),
                "norm_stats": stability.buffer_stats(raw_model, label=raw_model.op_label)})

    def failed_op(step, pre_step, shape):
        """NormFormer Table 3's "failed operation": the step's micro-batches re-run from the pre-step state
        with hooks on, until one shows an op whose output (or its gradient) is non-finite or above 65504."""
        optimizer.zero_grad(set_to_none=True)
        for micro in range(micro_steps):
            if pre_step:
                stability.restore(raw_model, pre_step)
            x, y = get_batch("train", step, micro, shape=shape)

            def run_micro_batch():
                with autocast:
                    loss = raw_model(x, y)[1]
                loss.backward()

            record, _ = stability.find_first_overflow(raw_model, points, run_micro_batch)
            raw_model.zero_grad(set_to_none=True)
            if record:
                return record
        return None

    def diverged(step, lr, reason, record=None):
        if not master:
            return 3
        notes = []
        if record is None:
            notes.append("no op's output or gradient was above the float16 range (65504) or non-finite")
        if not any(op == "q@k" for _, op, *_ in points):
            notes.append("q@k needs --attn_impl=manual")
        log_event(log_path, {"event": "diverged", "step": step, "steps_survived": step, "lr": lr, "reason": reason,
                             "loss_tail": list(divergence.tail), "failed_op": record, "note": "; ".join(notes)})
        where = "none"
        if record:
            layer = f" at layer {record['layer']}" if record["layer"] is not None else ""
            where = f"{record['op']}{layer} ({record['pass']}, max |x| {record['max_abs']:.3g})"
        print(f"diverged at step {step} (survived {step} steps, lr {lr:.3e}): {reason}; first op over the "
              f"float16 range: {where}{' (' + '; '.join(notes) + ')' if notes else ''}; the last good checkpoint "
              f"is kept.")
        return 3

    resumed_at = saved_at = step if checkpoint else None
    t0, timed_from, tokens_per_step = time.time(), step, global_batch["tokens"]
    first_step, stop_everywhere = step, False
    model_flops = flops_per_token(raw_model, model_cfg)
    peak = gpu_peak_flops(tc, device) if device_type == "cuda" else None
    while True:
        lr = get_lr(step, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if (step % tc.eval_interval == 0 or step == tc.max_iters) and step != resumed_at:
            losses = evaluate()
            spread = rank_spread(raw_model) if ddp else 0.0
            if master:
                print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                log_event(log_path, {"event": "eval", "step": step, "train_loss": losses["train"],
                                     "val_loss": losses["val"], "lr": lr, "rank_spread": spread})
            finite = math.isfinite(losses["val"])
            if step > 0 and finite and (losses["val"] < best_val or tc.always_save_checkpoint):
                if losses["val"] < best_val:
                    best_val, best_step = losses["val"], step
                saved_at = save(step)
            if not finite:
                return diverged(step, lr, f"non-finite validation loss ({losses['val']})")
        if step >= tc.max_iters:
            if master:
                log_event(log_path, {"event": "done", "step": step, "val_loss": losses["val"]})
            return 0
        if stop_everywhere if ddp else stop.requested:
            if saved_at != step:
                save(step)
            if master:
                log_event(log_path, {"event": "interrupted", "step": step})
                launcher = f"torchrun --nproc_per_node={world_size}" if ddp else "python"
                print(f"interrupted at step {step}; the checkpoint is saved. To continue: "
                      f"{launcher} train.py --out_dir={tc.out_dir} --resume")
            return 130
        shape = sequence_shape(step, tc, model_cfg.block_size)
        pre_step = stability.snapshot(raw_model, parameters=False) if stateful else None
        sums = torch.zeros(3, device=device)  # cross-entropy, z-loss term (means over micro-steps), stop request
        for micro in range(micro_steps):
            x, y = get_batch("train", step, micro, shape=shape)
            # DDP: all-reduce the gradients only on the last micro-step
            sync = micro == micro_steps - 1 or not ddp
            with (contextlib.nullcontext() if sync else model.no_sync()), autocast:
                logits, loss = model(x, y)
                z_term = z_loss_term(logits) if tc.z_loss else torch.zeros((), device=device)
            scaler.scale((loss + tc.z_loss * z_term) / micro_steps).backward()
            sums[:2] += torch.stack([loss.detach(), z_term.detach()]) / micro_steps
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
        if ddp:
            # every process then takes the same divergence and spike decisions, and a stop request (Ctrl-C) on
            # any process rides along, so that all stop before the next step without a sync of their own
            sums[2] = stop.requested
            dist.all_reduce(sums)
            sums /= world_size
        # the step's one host read: divergence and the spike monitor need it before the optimizer step
        loss_value, z_value, stops, grad_value = torch.cat([sums, grad_norm.view(1).float()]).tolist()
        stop_everywhere = stops > 0
        # float16: a non-finite gradient from a finite loss is the loss scale overflowing, not a divergence.
        # GradScaler skips this update and halves the scale (Micikevicius et al. 2018 §3.2); only the loss is
        # checked, and the spike monitor does not see the step
        overflow = scaler.is_enabled() and math.isfinite(loss_value) and not math.isfinite(grad_value)
        reason = divergence.check(loss_value, None if overflow else grad_value)
        if overflow and not reason and scaler.get_scale() * scaler.get_backoff_factor() < MIN_LOSS_SCALE:
            reason = (f"float16 gradients overflow with the loss scaled by {scaler.get_scale():.3g}; the next scale "
                      f"would be below {MIN_LOSS_SCALE:g}")
        if reason:
            return diverged(step, lr, reason, failed_op(step, pre_step, shape))
        z_scores = (math.nan, math.nan) if overflow else monitor.update(loss_value, grad_value)
        skip = tc.skip_spikes and monitor.is_spike(*z_scores)
        if monitor.is_spike(*z_scores) and master:
            log_event(log_path, {"event": "spike", "step": step + 1, "loss": loss_value, "grad_norm": grad_value,
                                 "z_loss_score": z_scores[0], "z_grad_score": z_scores[1], "skipped": skip})
        instrumented = master and any(n and (step + 1) % n == 0
                                      for n in (tc.telemetry_interval, tc.fp16_headroom_interval))
        before = stability.snapshot(raw_model) if instrumented else None
        pause_for_tests(f"step@{step + 1}")  # gradients computed, weights not yet updated
        if not skip:
            scaler.step(optimizer)
        scaler.update()
        if overflow and master:
            log_event(log_path, {"event": "overflow", "step": step + 1, "loss": loss_value,
                                 "loss_scale": scaler.get_scale()})
        weights = None
        if instrumented and tc.telemetry_interval and (step + 1) % tc.telemetry_interval == 0:
            weights = stability.weight_stats(raw_model, before, splits=raw_model.weight_splits(),
                                             label=raw_model.op_label)
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == first_step + 1 and step % tc.log_interval:
            # the first step compiles and warms up (seconds to minutes on a GPU): the first line times the others
            t0, timed_from = time.time(), step
        if instrumented:
            telemetry(step, x, y, weights)
        if step % tc.log_interval == 0 and master:
            dt = (time.time() - t0) / (step - timed_from)
            t0, timed_from = time.time(), step
            eta = format_duration(dt * (tc.max_iters - step))
            mfu = f" | MFU {model_flops * tokens_per_step / dt / peak / gpus:.1%}" if peak else ""
            grad_text = "overflow (update skipped)" if overflow else f"{grad_value:.3f}"
            print(f"step {step} | loss {loss_value:.4f} | lr {lr:.2e} | grad norm {grad_text} | "
                  f"{dt * 1000:.1f} ms/step | {tokens_per_step / dt:,.0f} tokens/s{mfu} | ETA {eta}")
            event = {"event": "train", "step": step, "loss": loss_value, "lr": lr,
                     "grad_norm": None if overflow else grad_value,
                     "ms_per_step": dt * 1000, "tokens_per_s": tokens_per_step / dt}
            if tc.z_loss:
                event["z_loss"] = z_value
            if tc.seq_warmup_iters:
                event["seq_len"] = shape[0]
            log_event(log_path, event)


def main(argv):
    if "--help" in argv or "-h" in argv:
        print_help()
        return 0
    try:
        run = setup(argv)
    except (UsageError, data.DataError) as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    stop = StopRequest()
    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = train(**run, stop=stop)
        if run["ddp"]:
            # every return of train() is agreed by all ranks: wait for each to leave its last collective before
            # any tears the process group down
            dist.barrier()
        return code
    except UsageError as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        if run["rank"] == 0:
            print(f"train.py: {e}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if run["ddp"]:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""
Train a nanonorm GPT. One process:
    python train.py --norm=rmsnorm
One node, any number of processes (DDP; nccl on CUDA, gloo on CPU):
    torchrun --standalone --nproc_per_node=8 train.py --preset=normformer --compile
Flags are --key=value (or --key value); a bare --flag sets a boolean. configurable.txt lists them all.
A run writes out_dir/config.json (the resolved config), out_dir/log.jsonl (one JSON object per event)
and out_dir/ckpt.pt (atomically, at each eval); --resume continues from it exactly.
"""

import contextlib
import dataclasses
import difflib
import hashlib
import json
import math
import os
import sys
import time
import typing
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
from model import GPT, GPTConfig, PRESETS


@dataclass
class TrainConfig:
    # data
    dataset: str = "builtin"
    tokenizer: Literal["byte", "gpt2"] = "byte"
    data_dir: str = "data"
    batch_size: int = 32  # sequences per micro-step on each process
    grad_accum: int = 1  # micro-steps per optimizer step, summed over all processes
    # optimizer and schedule
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_iters: int = 50
    max_iters: int = 1000
    lr_decay_iters: Optional[int] = None  # None: decay until max_iters
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    # evaluation, logging, checkpoints
    out_dir: str = "out"
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 25
    always_save_checkpoint: bool = True
    resume: bool = False
    preset: Optional[str] = None
    seed: int = 1337
    # system
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    compile: bool = False


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
            if kind is bool and not next_is_value:
                text = "True"
            elif next_is_value:
                text, i = argv[i + 1], i + 1
            else:
                raise UsageError(f"--{name} needs a value (--{name}=VALUE)")
        given[name] = convert(name, text, kind)
        i += 1
    return given


def build_configs(given):
    """The preset first (model.PRESETS), then the explicit flags; config-time checks give one line."""
    train_args = {k: v for k, v in given.items() if k in TrainConfig.__dataclass_fields__}
    model_args = dict(PRESETS[given["preset"]]) if given.get("preset") else {}
    model_args.update({k: v for k, v in given.items() if k in GPTConfig.__dataclass_fields__})
    try:
        return GPTConfig(**model_args), TrainConfig(**train_args)
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_train_config(tc, world_size):
    positive = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval")
    for name in positive:
        if getattr(tc, name) < 1:
            raise UsageError(f"--{name}={getattr(tc, name)} must be a positive integer")
    if tc.grad_accum % world_size:
        raise UsageError(f"--grad_accum={tc.grad_accum} must be divisible by the number of processes ({world_size})")
    for name, ok, allowed in (("warmup_iters", tc.warmup_iters >= 0, ">= 0"), ("lr", tc.lr > 0, "> 0"),
                              ("min_lr", tc.min_lr >= 0, ">= 0")):
        if not ok:
            raise UsageError(f"--{name}={getattr(tc, name)} must be {allowed}")
    if tc.device != "auto" and tc.device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device={tc.device} is not a device; choose auto, cpu, cuda, cuda:N or mps")


def get_lr(step, tc):
    """Linear warmup to --lr, then cosine or linear decay to --min_lr at lr_decay_iters (or constant)."""
    if step < tc.warmup_iters:
        return tc.lr * (step + 1) / (tc.warmup_iters + 1)
    decay_iters = tc.lr_decay_iters or tc.max_iters
    if tc.lr_schedule == "constant" or decay_iters <= tc.warmup_iters:
        return tc.lr
    ratio = min(1.0, (step - tc.warmup_iters) / (decay_iters - tc.warmup_iters))
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if tc.lr_schedule == "cosine" else 1.0 - ratio
    return tc.min_lr + coeff * (tc.lr - tc.min_lr)


def batch_generator(*stream):
    """A fresh generator per batch, seeded from (seed, rank, step, micro-step). The batches of a step are
    then a function of the step alone, so the step is the data position a checkpoint needs to resume.
    sha256, not hash(): the same seeds on every machine and Python version."""
    digest = hashlib.sha256(repr(stream).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


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


def save_checkpoint(path, state):
    """Write to a temporary file, then rename over the old one: a crash never leaves half a checkpoint."""
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


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
    sums = torch.stack([t.detach().double().sum() for t in [*model.parameters(), *model.buffers()]])
    gathered = [torch.zeros_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    return max((g - sums).abs().max().item() for g in gathered)


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
    if tc.dtype == "auto":
        # CPUs without bf16 units run bf16 autocast 20-30x slower than float32 (measured on the CI machine)
        bf16_ok = device_type == "cuda" and torch.cuda.is_bf16_supported()
        tc = dataclasses.replace(tc, dtype="bfloat16" if bf16_ok else "float32")
    if tc.dtype == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError("--dtype=bfloat16 is not supported by this GPU; use --dtype=float16")
    return device, tc


def setup(argv):
    """Everything that can fail on bad input, before any work: flags, DDP, device, data, model config."""
    given = parse_flags(argv)
    ddp = int(os.environ.get("RANK", -1)) != -1
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    model_cfg, tc = build_configs(given)
    check_train_config(tc, world_size)
    resume_from = os.path.join(tc.out_dir, "ckpt.pt") if tc.resume else None
    checkpoint = None
    if resume_from:
        if not os.path.exists(resume_from):
            raise UsageError(f"--resume: no checkpoint at {resume_from} (start without --resume to train from scratch)")
        try:
            checkpoint = torch.load(resume_from, map_location="cpu", weights_only=True)
        except Exception as e:
            raise UsageError(f"--resume: cannot read {resume_from} ({type(e).__name__}); it is not a nanonorm "
                             "checkpoint, or it is damaged") from None
        saved = checkpoint["model_config"]
        changed = [k for k in given if k in saved and given[k] != saved[k]]
        if changed:
            raise UsageError(f"--resume: the model flags {', '.join('--' + k for k in changed)} differ from the "
                             f"checkpoint's; a resumed run keeps its model")
        model_cfg = GPTConfig(**saved)
        tc = dataclasses.replace(TrainConfig(**checkpoint["train_config"]), **{k: v for k, v in given.items()
                                                                               if k in TrainConfig.__dataclass_fields__})
    device, tc = resolve_device(tc)
    device_type = device.split(":")[0]
    if ddp:
        if device_type == "cuda":
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    if device_type == "cpu":
        # torchrun sets OMP_NUM_THREADS=1 per process: give each process its share of the cores instead
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_world_size))
    if rank == 0:
        data.prepare(tc.dataset, tc.tokenizer, tc.data_dir)
    if ddp:
        dist.barrier()  # the other processes wait until process 0 has prepared the data
    folder = data.prepare(tc.dataset, tc.tokenizer, tc.data_dir)  # prepared now: this only finds the folder
    meta = data.load_meta(folder)
    data.check_length(meta, model_cfg.block_size)
    padded_vocab = 64 * math.ceil(meta["vocab_size"] / 64)  # a multiple of 64 is faster on GPUs (nanoGPT)
    if "vocab_size" in given or checkpoint:
        if model_cfg.vocab_size < meta["vocab_size"]:
            raise UsageError(f"--vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's {meta['vocab_size']}")
    else:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=padded_vocab)
    if model_cfg.pn_warmup is None:
        # PowerNorm App. A.1 warms psi up; its warmup defaults to the LR warmup, counted in training forward calls
        model_cfg = dataclasses.replace(model_cfg, pn_warmup=tc.warmup_iters * tc.grad_accum // world_size)
    return dict(model_cfg=model_cfg, tc=tc, checkpoint=checkpoint, folder=folder, meta=meta, ddp=ddp, rank=rank,
                world_size=world_size, device=device, device_type=device_type)


def train(model_cfg, tc, checkpoint, folder, meta, ddp, rank, world_size, device, device_type):
    master = rank == 0
    micro_steps = tc.grad_accum // world_size
    os.makedirs(tc.out_dir, exist_ok=True)
    log_path = os.path.join(tc.out_dir, "log.jsonl")
    ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
    torch.manual_seed(tc.seed)  # the same initial weights on every process
    model = GPT(model_cfg).to(device)
    optimizer = configure_optimizer(model, tc, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=tc.dtype == "float16")
    step, best_val = 0, float("inf")
    torch.manual_seed(tc.seed + rank)  # dropout differs between processes
    if checkpoint:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        step, best_val = checkpoint["step"], checkpoint["best_val"]
        rng = checkpoint["rng"][rank] if len(checkpoint["rng"]) == world_size else None
        if rng:
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and device_type == "cuda":
                torch.cuda.set_rng_state(rng["cuda"])
    if master:
        if not checkpoint:
            open(log_path, "w").close()  # a new run starts a new log; a resumed one appends to its own
        with open(os.path.join(tc.out_dir, "config.json"), "w") as f:
            json.dump({"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(tc),
                       "world_size": world_size, "data": meta, "torch": torch.__version__}, f, indent=2)
        print(f"{model.num_params():,} parameters | data {folder} | unigram entropy of val "
              f"{meta['unigram_entropy']:.4f} nats/token | device {device} {tc.dtype} x{world_size}")
    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)
    eval_model = model.module if ddp else model  # compiled if --compile; no DDP wrapper, as nothing syncs
    autocast = torch.autocast(device_type, dtype=getattr(torch, tc.dtype), enabled=tc.dtype != "float32")

    def get_batch(split, *stream):
        return data.get_batch(folder, split, tc.batch_size, model_cfg.block_size,
                              batch_generator(tc.seed, rank, *stream), device)

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
            if ddp:
                dist.all_reduce(total)
            losses[split] = total.item() / (tc.eval_iters * world_size)
        model.train()
        return losses

    resumed_at = step if checkpoint else None
    t0, tokens_per_step = time.time(), tc.batch_size * model_cfg.block_size * micro_steps * world_size
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
                best_val = min(best_val, losses["val"])
                rng_states = gather_rng_states(world_size)
                if master:
                    save_checkpoint(ckpt_path, {
                        "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "step": step, "best_val": best_val, "rng": rng_states,
                        "model_config": dataclasses.asdict(model_cfg), "train_config": dataclasses.asdict(tc)})
            if not finite:
                if master:
                    print(f"step {step}: val loss is {losses['val']}; stopping, the last good checkpoint is kept")
                return 1
        if step >= tc.max_iters:
            return 0
        loss_sum = torch.zeros((), device=device)
        for micro in range(micro_steps):
            x, y = get_batch("train", step, micro)
            # DDP: all-reduce the gradients only on the last micro-step
            sync = micro == micro_steps - 1 or not ddp
            with (contextlib.nullcontext() if sync else model.no_sync()), autocast:
                loss = model(x, y)[1] / micro_steps
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % tc.log_interval == 0 and master:
            loss_value, dt = loss_sum.item(), (time.time() - t0) / tc.log_interval
            t0 = time.time()
            print(f"step {step} | loss {loss_value:.4f} | lr {lr:.2e} | grad norm {grad_norm.item():.3f} | "
                  f"{dt * 1000:.1f} ms/step | {tokens_per_step / dt:,.0f} tokens/s")
            log_event(log_path, {"event": "train", "step": step, "loss": loss_value, "lr": lr,
                                 "grad_norm": grad_norm.item(), "ms_per_step": dt * 1000,
                                 "tokens_per_s": tokens_per_step / dt})


def main(argv):
    try:
        run = setup(argv)
    except (UsageError, data.DataError) as e:
        print(f"train.py: {e}", file=sys.stderr)
        return 2
    try:
        return train(**run)
    finally:
        if run["ddp"]:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""
Train a nanonorm GPT. One process:
    python train.py --norm=rmsnorm
One node, any number of processes (DDP; nccl on CUDA, gloo on CPU):
    torchrun --standalone --nproc_per_node=8 train.py --preset=normformer --compile
Flags are --key=value (or --key value); a bare --flag sets a boolean. python train.py --help lists them all
(configurable.txt). A run writes out_dir/config.json (the resolved config), out_dir/log.jsonl (one JSON object
per event) and out_dir/ckpt.pt (atomically, at each eval); --resume continues from it exactly. One run at a time
uses an out_dir (it holds out_dir/run.lock).
The flags become the run's configs in configs.py (TrainConfig, and the one resolution of both configs). Read on
for the LR schedule and train(), the loop; engine/ holds the command line (flags.py), the run folder
(run_folder.py), the device and processes (runtime.py) and stops and exit codes (signals.py); diagnostics/ the
loss-spike instruments (instruments.py) and the batch-statistic norms' leakage measurement (leakage.py).
"""

from engine import starting  # first: a Ctrl-C from here to main's own handling is one line and exit code 130

import contextlib
import dataclasses
import hashlib
import math
import signal
import sys
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configs
import data
from engine import run_folder
from engine import run_reader
from engine import files
from engine import flags
from engine import runtime
from engine import signals
from engine import tensorboard_view
from engine import views
from engine import wandb_view
from diagnostics.instruments import Instruments
from diagnostics.leakage import Leakage
from configs import TrainConfig
from model import GPT, GPTConfig, configure_optimizer, flops_per_token


def get_lr(step, tc):
    """Linear warmup to --lr, then cosine or linear decay to --min_lr at lr_decay_iters (or constant).
    ramp: NormFormer's LR stability test (final §6, Fig. 5, and §9.1: 0 to 0.1 over 1,000 steps; arXiv v1 §4,
    Table 3), lr * step / max_iters from 0, no warmup and no decay, run until the loss diverges."""
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


@dataclass
class Run:
    """One run as setup() checked and prepared it, for train(): its configs and processes; on --resume the
    checkpoint it continues, the log's events up to it (run_folder.past_events) and the settings the resume changed
    (configs.resume_changes); and the prepared data's folder and meta.json."""
    model_cfg: GPTConfig
    tc: TrainConfig
    machine: runtime.Machine
    checkpoint: Optional[dict]
    past_events: list
    resume_changes: dict
    data_folder: str
    data_meta: dict


class EventLog:
    """The run's log.jsonl as one logger, for train() and the instruments alike: log(event) appends the event
    (process 0 writes it, the others write nothing)."""

    def __init__(self, path, master):
        self.path, self.master = path, master

    def __call__(self, event):
        if self.master:
            run_folder.log_event(self.path, event)


def train(run, stop):
    """Evaluate and checkpoint every eval_interval steps; between, one optimizer step of grad_accum micro-batches
    per process. Returns the exit code: 0 done, 3 diverged, 130 stopped by Ctrl-C, SIGTERM or SIGHUP (with a
    checkpoint)."""
    model_cfg, tc, machine, checkpoint = run.model_cfg, run.tc, run.machine, run.checkpoint
    autocast = torch.autocast(machine.device_type, dtype=getattr(torch, tc.dtype), enabled=tc.dtype != "float32")
    log = EventLog(run_reader.log_path(tc.out_dir), machine.master)
    raw_model, optimizer, scaler, instruments = build(model_cfg, tc, machine, autocast, log)
    step, best_val, best_step = 0, float("inf"), 0  # the best val loss so far, and its step
    if checkpoint:
        step, best_val, best_step = run_folder.restore(checkpoint, raw_model, optimizer, scaler, tc, machine)
        instruments.load_state_dict(checkpoint)  # a resumed run flags, skips and diverges where the whole one would
    run_folder.start_run(model_cfg, tc, machine, raw_model, step if checkpoint else None, run.past_events,
                         run.resume_changes, run.data_folder, run.data_meta)
    if machine.master:
        tensorboard_view.start(tc.out_dir, log.path, tc.tensorboard)
        wandb_view.start(tc.out_dir, log.path, tc.wandb, resumed=checkpoint is not None)
    model = torch.compile(raw_model) if tc.compile else raw_model
    if machine.ddp:
        model = DDP(model, device_ids=[int(machine.device.split(":")[1])] if machine.device_type == "cuda" else None)
    saved_at = step if checkpoint else None
    # a checkpoint written by a stop during its step's evaluation is evaluated again on resume
    resumed_at = step if checkpoint and checkpoint.get("evaluated", True) else None
    progress = runtime.Progress(step)
    while True:
        lr = get_lr(step, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # ---- EVALUATE AND CHECKPOINT every eval_interval steps: both splits' loss, then a checkpoint if it improved
        # (or at every evaluation: --always_save_checkpoint, the default)
        evaluated = (step % tc.eval_interval == 0 or step == tc.max_iters) and step != resumed_at
        losses = None
        if evaluated:
            losses = evaluate(model, raw_model, run.data_folder, tc, machine, autocast, model_cfg.block_size, stop)
        improved = False
        if losses:
            spread = runtime.rank_spread(raw_model) if machine.ddp else 0.0
            if machine.master:
                print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            leakage = {key: value for key, value in losses.items() if key not in ("train", "val")}
            log({"event": "eval", "step": step, "train_loss": losses["train"], "val_loss": losses["val"], **leakage,
                 "lr": lr, "rank_spread": spread})
            if not math.isfinite(losses["val"]):
                return instruments.report(step, lr, f"non-finite validation loss ({losses['val']})")
            improved = losses["val"] < best_val
            if improved:
                best_val, best_step = losses["val"], step
        # the run stops here on a stop request that came during this evaluation (then losses is None), or during
        # the last step (stop.agreed: under DDP, one that every process saw at the step's host read)
        stopping = (evaluated and losses is None) or (stop.agreed and step < tc.max_iters)
        checkpoint_due = losses and step > 0 and (improved or tc.always_save_checkpoint)
        if checkpoint_due or (stopping and saved_at != step):
            run_folder.save(tc.out_dir, {
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                "step": step, "best_val": best_val, "best_step": best_step, **instruments.state_dict(),
                "evaluated": losses is not None, "data_sha256": run.data_meta["source"]["sha256"],
                "model_config": dataclasses.asdict(model_cfg), "train_config": dataclasses.asdict(tc)},
                tc.keep_checkpoints, machine)
            saved_at = step
        if stopping:
            return run_folder.interrupted(step, tc, machine, log.path)
        if step >= tc.max_iters:
            return run_folder.finished(step, losses["val"], saved_at, tc, machine, log.path)
        # ---- TRAINING SECTION BEGIN: one optimizer step over grad_accum micro-batches on each process
        shape = sequence_shape(step, tc, model_cfg.block_size)
        means = torch.zeros(2, device=machine.device)  # the cross-entropy and the z-loss term, over micro-steps
        with instruments.watching(step):  # forensics' pre-step buffers; --fp16_overflow_fails's forward hooks
            for micro in range(tc.grad_accum):
                x, y = get_batch(run.data_folder, "train", tc, machine, step, micro, shape=shape)
                # DDP: all-reduce the gradients only on the last micro-step
                sync = micro == tc.grad_accum - 1 or not machine.ddp
                with (contextlib.nullcontext() if sync else model.no_sync()), autocast:
                    logits, loss = model(x, y)
                    z_term = z_loss_term(logits) if tc.z_loss else torch.zeros((), device=machine.device)
                scaler.scale((loss + tc.z_loss * z_term) / tc.grad_accum).backward()
                means += torch.stack([loss.detach(), z_term.detach()]) / tc.grad_accum
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
        read = runtime.host_read(means, grad_norm, stop, machine)
        verdict = instruments.judge(step, read.loss, read.grad_norm, scaler)  # spikes, divergence: before the update
        if verdict.diverged:
            batches = (get_batch(run.data_folder, "train", tc, machine, step, i, shape=shape)
                       for i in range(tc.grad_accum))
            return instruments.report(step, lr, verdict.diverged, batches)
        if not verdict.skip:
            scaler.step(optimizer)
        scaler.update()
        instruments.after_update(step + 1, verdict, scaler, x, y)
        optimizer.zero_grad(set_to_none=True)
        step += 1
        # ---- TRAINING SECTION END: everything below is logging
        progress.step_done(step, tc.log_interval)
        if step % tc.log_interval == 0 and machine.master:
            dt, _ = progress.lap(step)
            tokens = tc.batch_size * tc.grad_accum * machine.world_size * model_cfg.block_size
            mfu = runtime.mfu(flops_per_token(raw_model, model_cfg) * tokens / dt, tc, machine)
            grad_text = "overflow (update skipped)" if verdict.overflow else f"{read.grad_norm:.3f}"
            mfu_text = f" | MFU {mfu:.1%}" if mfu else ""
            print(f"step {step} | loss {read.loss:.4f} | lr {lr:.2e} | grad norm {grad_text} | {dt * 1000:.1f} "
                  f"ms/step | {tokens / dt:,.0f} tokens/s{mfu_text} | ETA "
                  f"{runtime.format_duration(dt * (tc.max_iters - step))}")
            event = {"event": "train", "step": step, "loss": read.loss, "lr": lr,
                     "grad_norm": None if verdict.overflow else read.grad_norm,
                     "ms_per_step": dt * 1000, "tokens_per_s": tokens / dt}
            if tc.z_loss:
                event["z_loss"] = read.z_loss
            if tc.seq_warmup_iters:
                event["seq_len"] = shape[0]
            log(event)


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


def batch_generator(*stream):
    """A fresh generator per batch, seeded from (seed, rank, step, micro-step). The batches of a step are
    then a function of the step alone, so the step is the data position a checkpoint needs to resume.
    sha256, not hash(): the same seeds on every machine and Python version."""
    digest = hashlib.sha256(repr(stream).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def get_batch(folder, split, tc, machine, *stream, shape):
    length, batch = shape
    return data.get_batch(folder, split, batch, length, batch_generator(tc.seed, machine.rank, *stream),
                          machine.device)


@torch.no_grad()
def evaluate(model, raw_model, folder, tc, machine, autocast, block_size, stop):
    """Mean loss per split over the same eval_iters x batch_size windows at every evaluation, in every run
    (data.eval_starts), shared among the processes, in eval mode (running statistics), and with a batch-statistic
    norm the leakage of the same batches (diagnostics/leakage.py: nanonorm's measure, on PowerNorm §3's batch
    statistics). None when a stop request (Ctrl-C)
    comes first: the processes agree on it before each batch."""
    if machine.ddp:
        # running statistics are per process; rank 0's win, as DDP's own broadcast does
        for buffer in raw_model.buffers():
            dist.broadcast(buffer, src=0)
    model.eval()
    eval_model = model.module if machine.ddp else model  # compiled if --compile; no DDP wrapper, as nothing syncs
    leakage = Leakage(raw_model)
    losses = {}
    for split in ("train", "val"):
        starts = data.eval_starts(data.split_tokens(folder, split), block_size, tc.eval_iters * tc.batch_size)
        sums = torch.zeros(1 + len(leakage), device=machine.device)  # over windows: the loss, then the leakage's
        for batch in data.eval_batches(starts, tc.batch_size, machine.rank, machine.world_size):
            if runtime.agree(stop.requested, machine):
                model.train()
                return None
            if not batch:
                continue  # this process's share ran out before the others'
            x, y = data.windows(folder, split, batch, block_size, machine.device)
            with autocast:
                loss = eval_model(x, y)[1].float().reshape(1)  # the model's loss is a mean over its batch
                sums += torch.cat([loss, leakage.measure(x, y)]) * len(batch)
        if machine.ddp:
            dist.all_reduce(sums)
        means = (sums / len(starts)).tolist()
        losses.update({split: means[0], **leakage.named(split, means[1:])})
    model.train()
    return losses


def build(model_cfg, tc, machine, autocast, log):
    """The model (plain: not compiled, not DDP-wrapped), AdamW, the GradScaler (float16 only) and the instruments,
    which log with the run's logger."""
    torch.manual_seed(tc.seed)  # the same initial weights on every process
    model = GPT(model_cfg).to(machine.device)
    optimizer = configure_optimizer(model, tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), machine.device_type)
    scaler = torch.amp.GradScaler(machine.device_type, enabled=tc.dtype == "float16")
    instruments = Instruments(model, tc, log, machine.master, autocast, machine.device)
    torch.manual_seed(tc.seed + machine.rank)  # dropout differs between processes; a checkpoint's RNG replaces it
    return model, optimizer, scaler, instruments


def fresh_run(tc):
    """A fresh run: neither --resume nor --overwrite, so a folder holding a run is refused (check_out_dir)."""
    return not tc.resume and not tc.overwrite


def setup(argv, machine):
    """Everything that can fail on bad input, checked by each process on its own before any work (no process group
    yet: bad input stops every process the same way, and only process 0 prints it): flags, run folder, checkpoint,
    configs, log, data, memory. Then the process group, and the run folder's lock (run_folder.claim), which the
    caller keeps open for the life of the run; only then the notes of the checks (a checkpoint or log passed over),
    so that a refused run says one line. Returns the Run and the lock."""
    given = configs.parse_flags(argv)
    notes = []  # the checkpoints passed over, said once the run goes ahead

    def checkpoint_of(tc):
        """The run folder checked for where the run goes (--out_dir, --resume, --overwrite); on --resume its newest
        checkpoint that loads."""
        run_folder.check_out_dir(tc.out_dir, fresh=fresh_run(tc))
        if not tc.resume:
            return None
        checkpoint, passed_over = run_folder.newest_checkpoint(tc.out_dir, configs.damaged_configs)
        notes.extend(passed_over)
        return checkpoint

    model_cfg, tc, device, checkpoint = configs.resolve(given, machine.world_size, checkpoint_of=checkpoint_of)
    tensorboard_view.check_installed(tc.tensorboard)
    wandb_view.check_installed(tc.wandb)
    past_events, log_notes = run_folder.past_events(tc.out_dir) if checkpoint else ([], [])
    if checkpoint:  # the checkpoint, config.json and the log are one run's (a copied-in piece is not adopted)
        run_folder.check_pieces(tc.out_dir, checkpoint, past_events, configs.kept_flags())
    # what this resume changed of the run's settings (those it may change: configs.RESUME), logged and said
    resume_changes = configs.resume_changes(checkpoint["train_config"], tc) if checkpoint else {}
    # every process asks: data.prepare's file lock lets one process per disk tokenize while the others wait
    data_folder = data.prepare(tc.dataset, tc.tokenizer, tc.data_dir)
    data_meta = data.load_meta(data_folder)
    configs.check_data(data_meta, model_cfg, checkpoint)
    runtime.check_memory(model_cfg, tc, device, machine)
    runtime.start(device, machine, tc.rendezvous_timeout)
    lock = run_folder.claim(tc.out_dir, fresh_run(tc), machine)
    if machine.master:
        for line in [*(f"train.py: note: {note}" for note in notes + log_notes),
                     *configs.no_effect_warnings(given, model_cfg, tc, device)]:
            print(line, file=sys.stderr)
    return Run(model_cfg, tc, machine, checkpoint, past_events, resume_changes, data_folder, data_meta), lock


def fail(code, error, machine):
    """The one line of an error that ends the run (bad input: 2, a failed write: 1), printed by process 0; under
    torchrun the processes leave together (runtime.leave_together), except from a rendezvous, where each process
    failed on its own (runtime.NotJoined). Returns the exit code."""
    line = f"train.py: {' '.join(str(error).split())}"
    if machine.master:
        print(line, file=sys.stderr, flush=True)
    if machine.ddp and not isinstance(error, runtime.NotJoined):
        runtime.leave_together(code, machine)
    if not machine.master:  # torchrun has not ended this process: an error of its own, to say itself
        print(line, file=sys.stderr)
    return code


def main(argv):
    """Exit codes: 0 done, 1 a file could not be written, 2 bad input, 3 diverged, 130 stopped (with a checkpoint;
    143 or 129 for a SIGTERM or SIGHUP before training): docs/guarantees.md."""
    if flags.wants_help(argv):
        flags.print_help(__doc__, catalog=configs.catalog())
        return 0
    try:
        machine = runtime.Machine.from_env()
    except flags.UsageError as e:  # before anything is written, and with no process group to leave together
        return flags.fail("train.py", e)
    stop, handlers, before, output, lock = runtime.StopRequest(machine.ddp, machine.master), {}, {}, None, None
    try:
        starting.done()  # in the try: from here a Ctrl-C is the KeyboardInterrupt below; before, starting's line
        before = signals.stop_on_signals()  # until training: SIGTERM and SIGHUP stop at once, as Ctrl-C does
        output = signals.keep_output(stop.output_lost)  # a pipe or terminal that goes away stops the run as SIGHUP
        run, lock = setup(argv, machine)
        # SIGHUP: a closed terminal or ssh session stops the run as Ctrl-C does, with a checkpoint
        handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        code = train(run, stop)
        if machine.ddp:
            # every return of train() is agreed by all ranks: wait for each to leave its last collective before
            # any tears the process group down
            dist.barrier()
        return code
    except (flags.UsageError, data.DataError) as e:
        return fail(2, e, machine)
    except files.WriteError as e:
        return fail(1, e, machine)
    except RuntimeError as e:
        if not runtime.lost_a_peer(e, machine):
            raise
        print(f"train.py: process {machine.rank}: another process of the run stopped (its own line says why)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        # a second Ctrl-C, or a Ctrl-C, SIGTERM or SIGHUP before training: every write is whole or absent
        # (files.py), so no traceback
        sig = signals.signum(e)
        if machine.master:
            print("train.py: stopped at once by a second Ctrl-C; the checkpoints written so far are kept" if handlers
                  else f"train.py: stopped by {signals.name(sig)} before training began; prepared data is complete "
                  "or absent", file=sys.stderr)
        return signals.exit_code(sig)
    finally:
        signals.restore({**handlers, **before})
        signals.restore_output(output)
        views.close_all()
        if lock:
            lock.close()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""
probes.py's instruments applied to the steps of a training run: the spike monitor (and --skip_spikes), divergence, the
float16 loss-scale criterion, first-overflow forensics and the "diverged" report, and the telemetry and
headroom events. One object, a few verbs; every event it writes goes to log.jsonl (process 0 only).

The instruments keep their own state from step to step, and their windows and bounds go into each checkpoint
(state_dict): a resumed run flags, skips and diverges exactly where the uninterrupted one would, unless
--diverge_loss, --spike_window or --spike_z is given anew (those apply from the resumed step). A step meets them
three times, as llm.c's loop meets its outlier detectors: `with watching(step)` around its forward and backward
passes (the buffers forensics re-runs it from; --fp16_overflow_fails's hooks), `judge(...)` once before the update,
the one place where its fate is decided: diverged (then `report(...)` re-runs the step for the failed op and ends
the run with exit code 3), skipped (a spike under --skip_spikes), or taken; and `after_update(...)` once after it,
for the overflow, telemetry and headroom events.
"""

import contextlib
import functools
import math
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from diagnostics import probes
from diagnostics.probe_points import op_label, probe_points, weight_splits
from engine import run_reader
from engine.flags import UsageError

# float16: a run whose gradients overflow even with the loss scaled below this has diverged (fairseq's
# --min-loss-scale default, the code NormFormer trained with)
MIN_LOSS_SCALE = 1e-4

# the criterion a diverged event names, from probes.DivergenceCheck's reasons (nanonorm's own rules, not a
# paper's) and train.py's; lab/summary.py's criterion() reads the same names from older logs
CRITERIA = (("non-finite validation", "non-finite val loss"), ("non-finite", "non-finite loss"),
            ("float16", "float16 loss scale"), ("above the bound", "loss bound"), ("above its best", "loss gap"))


# --fp16_overflow_fails: a run that another rule ends names the op whose forward max |x| grew the most across
# this many training steps' forward passes (the newest 10, so the growth of the last 9 updates)
GROWTH_WINDOW = 10


def criterion_of(reason):
    return next((name for text, name in CRITERIA if text in reason), reason)


def at_layer(layer):
    return f" at layer {layer}" if layer is not None else ""


@dataclass
class Verdict:
    """What the instruments make of a step from its loss and gradient norm, before the optimizer step."""
    loss: float
    grad_norm: float
    diverged: Optional[str] = None  # the reason the run has diverged, or None
    overflow: bool = False  # float16: the scaled gradients overflowed; GradScaler skips the update
    spike: bool = False  # a loss or gradient-norm spike (the monitor's z-scores above --spike_z)
    skip: bool = False  # the optimizer step is skipped (a spike under --skip_spikes)
    criterion: Optional[str] = None  # the rule that ended the run: "fp16 overflow", "loss gap", ... (CRITERIA)
    failed_op: Optional[dict] = None  # --fp16_overflow_fails: the op over 65504 in this step's own forward


class Instruments:
    """The step's instruments over the plain (not compiled, not DDP-wrapped) model; they write their events with the
    run's logger, log(event), which train.py hands them (process 0 writes, the others write nothing)."""

    def __init__(self, model, tc, log, master, autocast, device):
        self.model, self.tc, self.log, self.master = model, tc, log, master
        self.autocast, self.device = autocast, device
        self.monitor = probes.SpikeMonitor(tc.spike_window, tc.spike_z)
        self.divergence = probes.DivergenceCheck(tc.diverge_loss, gap=tc.diverge_gap)
        self.points = probe_points(model)  # the papers' op names for the hooks of probes.py
        persistent = model.state_dict().keys()
        # running statistics change in a step's forward/backward; they are put back before forensics re-runs it
        self.stateful = any(name in persistent for name, _ in model.named_buffers())
        if tc.fp16_overflow_fails and tc.compile:
            raise UsageError("--fp16_overflow_fails needs --compile=False: its forward hooks see nothing inside "
                             "torch.compile")
        self.pre_step = None  # the buffers before this step's forward passes, for forensics to re-run it from
        self.forward_overflow = None  # --fp16_overflow_fails: the op over 65504 in this step's forward passes
        self.peaks = deque(maxlen=GROWTH_WINDOW)  # --fp16_overflow_fails: (step, {(layer, op, module): max |x|})
        self.weights = None  # the weights before this step's update, when telemetry or headroom is due
        self.ended = None  # the verdict that ended the run, for report()

    def state_dict(self):
        return {"spike_monitor": self.monitor.state_dict(), "divergence": self.divergence.state_dict()}

    def load_state_dict(self, checkpoint):
        """The checkpoint's windows and bounds. self.tc holds the checkpoint's --spike_window, --spike_z and
        --diverge_loss unless the resume gave new ones, which apply from here (a shorter window keeps its newest
        values; a new --diverge_loss=None sets the bound from the next loss)."""
        saved = checkpoint.get("spike_monitor", self.monitor.state_dict())
        self.monitor.load_state_dict({**saved, "window": self.tc.spike_window, "z_threshold": self.tc.spike_z})
        self.divergence.load_state_dict(checkpoint.get("divergence", self.divergence.state_dict()))
        if self.tc.diverge_loss != checkpoint["train_config"].get("diverge_loss"):
            self.divergence.max_loss = self.tc.diverge_loss

    @contextlib.contextmanager
    def watching(self, step):
        """Around a training step's forward and backward passes: keeps the buffers they will update, for forensics
        to re-run the step from, and with --fp16_overflow_fails hooks the forward passes for judge()."""
        self.pre_step = probes.snapshot(self.model, parameters=False) if self.stateful else None
        if not self.tc.fp16_overflow_fails:
            yield
            return
        with probes.Probe(self.model, self.points) as probe:
            yield
        self.forward_overflow = self.fp16_overflow(step, probe)

    def fp16_overflow(self, step, probe):
        """--fp16_overflow_fails, NormFormer arXiv v1 §4 (final: §6): its runs fail when an op's output is "too
        large to be represented in 16 bits". Emulated in any dtype: the first forward output of this step's
        micro-batches, in forward order, that is non-finite or above 65504, or None. The hooks only took one amax
        per output; the maxima are agreed across processes so that every one reaches the same verdict, and read
        from the device once; each op's largest goes into the window that grew_most() reads."""
        if not probe.pending:
            return None
        peaks = torch.stack([stats[0] for _, _, stats in probe.pending])
        peaks = torch.where(torch.isfinite(peaks), peaks, math.inf)  # NaN as inf: MAX of a NaN is undefined
        if dist.is_initialized():
            dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        peaks = peaks.tolist()
        step_peaks = {}
        for (point, _, _), peak in zip(probe.pending, peaks):  # an op runs once per micro-batch
            key = point.layer, point.op, point.module
            step_peaks[key] = max(peak, step_peaks.get(key, 0.0))
        self.peaks.append((step, step_peaks))
        over = next((i for i, peak in enumerate(peaks) if peak > probes.FP16_MAX), None)
        if over is None:
            return None
        point = probe.pending[over][0]
        return {"layer": point.layer, "op": point.op, "pass": "forward", "module": point.module, "max_abs": peaks[over]}

    def grew_most(self):
        """--fp16_overflow_fails, for a run that ended with no op over 65504: the op and layer whose forward max |x|
        grew by the largest factor from the oldest to the newest training step in the window, labelled as such in
        the diverged event. The window holds the forward passes of the last GROWTH_WINDOW
        training steps t0..t1 (each step's largest over its micro-batches): after a training step s diverged,
        t1 = s, whose forward ran on the weights after the last healthy update, and t0 = s - 9, so the growth is
        that of the updates of steps s - 9 to s - 1; after a non-finite validation loss before step s, t1 = s - 1.
        Fewer steps early in a run or after a resume (the window is not in the checkpoint); None with fewer than
        two, and ops whose max |x| was 0 at t0 are left out."""
        if len(self.peaks) < 2:
            return None
        (first, old), (last, new) = self.peaks[0], self.peaks[-1]
        ratios = [(new[key] / old[key], key) for key in new if old.get(key, 0.0) > 0]
        if not ratios:
            return None
        ratio, (layer, op, module) = max(ratios, key=lambda pair: pair[0])  # the first in forward order on a tie
        return {"layer": layer, "op": op, "module": module, "from": old[(layer, op, module)],
                "to": new[(layer, op, module)], "ratio": ratio, "steps": last - first}

    def judge(self, step, loss, grad_norm, scaler):
        """The step's verdict from its loss and gradient norm (the same on every process), before the update; with
        telemetry or headroom due, the weights before it, for the update/weight ratio."""
        # float16: a non-finite gradient from a finite loss is the loss scale overflowing, not a divergence.
        # GradScaler skips this update and halves the scale (Micikevicius et al. 2018 §3.2); only the loss is
        # checked, and the spike monitor does not see the step
        overflow = scaler.is_enabled() and math.isfinite(loss) and not math.isfinite(grad_norm)
        record = self.forward_overflow
        if record:
            layer = at_layer(record["layer"])
            reason = f"{record['op']}{layer} output max |x| {record['max_abs']:.3g} is above the float16 range (65504)"
            verdict = Verdict(loss, grad_norm, reason, overflow, criterion="fp16 overflow", failed_op=record)
        else:
            verdict = Verdict(loss, grad_norm, self.divergence.check(loss, None if overflow else grad_norm), overflow)
        if overflow and not verdict.diverged and scaler.get_scale() * scaler.get_backoff_factor() < MIN_LOSS_SCALE:
            verdict.diverged = (f"float16 gradients overflow with the loss scaled by {scaler.get_scale():.3g}; the "
                                f"next scale would be below {MIN_LOSS_SCALE:g}")
        if verdict.diverged:
            verdict.criterion = verdict.criterion or criterion_of(verdict.diverged)
            self.ended = verdict
            return verdict
        z_scores = (math.nan, math.nan) if overflow else self.monitor.update(loss, grad_norm)
        verdict.spike = self.monitor.is_spike(*z_scores)
        verdict.skip = verdict.spike and self.tc.skip_spikes
        if verdict.spike:
            self.log({"event": "spike", "step": step + 1, "loss": loss, "grad_norm": grad_norm,
                      "z_loss_score": z_scores[0], "z_grad_score": z_scores[1], "skipped": verdict.skip})
        self.weights = probes.snapshot(self.model) if self.due(step) else None
        return verdict

    def due(self, step):
        """Whether telemetry or headroom events are due after step (the step numbered step + 1 in the log)."""
        return self.master and any(n and (step + 1) % n == 0
                                   for n in (self.tc.telemetry_interval, self.tc.fp16_headroom_interval))

    def after_update(self, step, verdict, scaler, x, y):
        """The events of a step after its update (step: its number in the log, gradients still in .grad): the
        loss scale after an overflow, and telemetry and headroom from a hooked pass over its last micro-batch."""
        if verdict.overflow:
            self.log({"event": "overflow", "step": step, "loss": verdict.loss, "loss_scale": scaler.get_scale()})
        if self.weights is None:
            return
        tc = self.tc
        weights = None
        if tc.telemetry_interval and step % tc.telemetry_interval == 0:
            weights = probes.weight_stats(self.model, self.weights, splits=weight_splits(self.model),
                                             label=op_label)
        headroom = bool(tc.fp16_headroom_interval) and step % tc.fp16_headroom_interval == 0
        records, logits = self.probe_pass(x, y, backward=headroom)
        if headroom:
            self.log({"event": "headroom", "step": step, "ops": probes.headroom(records),
                      "fp16_max": probes.FP16_MAX})
        if weights is not None:
            forward = [r for r in records if r["pass"] == "forward"]
            self.log({"event": "telemetry", "step": step, "weights": weights,
                      "acts": [{k: r[k] for k in ("layer", "op", "std", "max_abs")} for r in forward],
                      "attn_logit_max": [{"layer": r["layer"], "value": r["max_abs"]} for r in forward
                                         if r["op"] == "q@k"],
                      "logits": probes.logit_stats(logits),
                      "gains": probes.gain_stats(self.model, label=op_label),
                      "norm_stats": probes.buffer_stats(self.model, label=op_label)})

    def probe_pass(self, x, y, backward):
        """The probes' own forward (and backward) of a batch on the plain model (hooks see nothing inside
        torch.compile), leaving the weights, buffers, gradients and RNG as they were."""
        saved = probes.snapshot(self.model, parameters=False)
        with torch.random.fork_rng(devices=[self.device] if self.device.startswith("cuda") else []):
            with probes.Probe(self.model, self.points, backward=backward, stats=True) as probe:
                with self.autocast:
                    logits, loss = self.model(x, y)
                if backward:
                    loss.backward()
        self.model.zero_grad(set_to_none=True)
        probes.restore(self.model, saved)
        return probe.records, logits.detach()

    def failed_op(self, batches):
        """NormFormer Table 3's "failed operation": the step's micro-batches re-run from the pre-step state
        with hooks on, until one shows an op whose output (or its gradient) is non-finite or above 65504."""
        self.model.zero_grad(set_to_none=True)
        for x, y in batches:
            if self.pre_step:
                probes.restore(self.model, self.pre_step)
            record, _ = probes.find_first_overflow(self.model, self.points, functools.partial(self.backward, x, y))
            self.model.zero_grad(set_to_none=True)
            if record:
                return record
        return None

    def backward(self, x, y):
        with self.autocast:
            loss = self.model(x, y)[1]
        loss.backward()

    def report(self, step, lr, reason, batches=()):
        """The "diverged" event and line, with the failed op of the step's micro-batches (batches: (x, y) of
        each, drawn again); returns exit code 3. The last good checkpoint, if the run has written one, stays as
        it is."""
        if not self.master:
            return 3
        ended = self.ended if self.ended and self.ended.diverged == reason else None
        criterion = ended.criterion if ended else criterion_of(reason)
        # --fp16_overflow_fails names the op of the step itself; the other criteria re-run the step to find one
        record = ended.failed_op if ended and ended.failed_op else self.failed_op(batches)
        grew = self.grew_most() if record is None else None
        notes = []
        if record is None:
            notes.append("no op's output or gradient was above the float16 range (65504) or non-finite")
            if not self.tc.fp16_overflow_fails:
                notes.append("--fp16_overflow_fails names the op whose max |x| grew the most")
        if not any(point.op == "q@k" for point in self.points):
            notes.append("q@k needs --attn_impl=manual")
        self.log({"event": "diverged", "step": step, "steps_survived": step, "lr": lr, "reason": reason,
                  "criterion": criterion, "loss_tail": list(self.divergence.tail), "failed_op": record,
                  "grew_most": grew, "note": "; ".join(notes)})
        where = "none"
        if record:
            where = f"{record['op']}{at_layer(record['layer'])} ({record['pass']}, max |x| {record['max_abs']:.3g})"
        grown = ""
        if grew:
            grown = (f"; grew the most over the last {grew['steps']} steps: {grew['op']}{at_layer(grew['layer'])} "
                     f"(max |x| {grew['from']:.3g} -> {grew['to']:.3g}, x{grew['ratio']:.3g})")
        # a run that diverges before its first checkpoint has none to keep (--overwrite removed any older one)
        kept = "the last good checkpoint is kept" if run_reader.has_checkpoint(self.tc.out_dir) else \
            "there is no checkpoint: it diverged before the first"
        print(f"diverged at step {step} (survived {step} steps, lr {lr:.3e}) by {criterion}: {reason}; first op "
              f"over the float16 range: {where}{' (' + '; '.join(notes) + ')' if notes else ''}{grown}; {kept}.")
        return 3

"""
Loss-spike instruments for any nn.Module, found by module and parameter names: a spike monitor, activation
and gradient probes with first-overflow forensics, fp16 headroom, and telemetry. Imports only torch.

What a training loop does with them:
- Every step, after the one host read of (loss, grad norm): `z_loss, z_grad = monitor.update(loss, gn)`;
  `monitor.is_spike(z_loss, z_grad)` logs a "spike" event (and skips the optimizer step with
  --skip_spikes, as llm.c does); `monitor.state_dict()` goes into the checkpoint.
- On divergence: `restore(model, snap)` to the pre-step state, then
  `find_first_overflow(model, probe_points(model), run_micro_batch)` names the first op whose output
  (forward order, then its gradient in backward order) is non-finite or above the float16 maximum
  (NormFormer §4, Table 3: "Failed operation: q@k, layer 0"). The caller restores weights and buffers
  again afterwards: the re-run changes .grad and any buffers the forward/backward updates.
  Divergence is detected before optimizer.step, so the parameters are still the pre-step ones; only
  buffers a step updates (BatchNorm/PowerNorm running statistics, nu) need `snapshot(model, parameters=False)`.
- Every --fp16_headroom_interval steps: `with Probe(model, points) as p: <forward/backward>`, then
  `headroom(p.records)` is the "headroom" event: how close each op comes to 65504 long before it fails.
- Every --telemetry_interval steps: `weight_stats` (gradient L2 and mean |g|, NormFormer Fig. 3; the
  update/weight ratio), `gain_stats` (norm gains, HeadScale, ResScale, LayerScale: NormFormer Fig. 4),
  `buffer_stats` (PowerNorm psi^2 and nu), `logit_stats` (output-logit growth, PaLM §5 z-loss;
  Wortsman et al. 2023), and `Probe(stats=True)` records for the residual stream's std and max |x|
  (Spike No More §3) and the max attention logit `q@k` (Dehghani et al. 2023).

Spike monitor (llm.c's outlier detector; llm-foundry's KillLossSpike; ZClip): z = (x - mean) / std over the
previous `window` values, std the population std. z is NaN until the window is full (as llm.c: a short
window early in training, while the loss falls fast, flags ordinary steps). Every finite value enters the
window after its z is computed. A non-finite value gets z = inf (always a spike) and never enters the
window, so it cannot poison later z's. A zero std gives z = 0 for x == mean and +-inf otherwise.

Probe records are dicts {"layer", "op", "pass": "forward"|"backward", "module", "max_abs"} (+ "std",
population std, with stats=True) in the order the values were produced; max |x| and std are computed in
float32 and read with one host sync when `records` is first read. A non-finite tensor gives a NaN or inf
max_abs. Probe the uncompiled module: hooks do not see inside torch.compile's graph.
"""

import math
import re
from collections import deque
from typing import NamedTuple, Optional

import torch

FP16_MAX = 65504.0
LAYER_RE = r"blocks\.(\d+)\."


class SpikeMonitor:
    """z_t = (x_t - mean(x_{t-w..t-1})) / pstdev(x_{t-w..t-1}) for the loss and the grad norm separately."""

    def __init__(self, window=100, z_threshold=5.0):
        self.window, self.z_threshold = window, z_threshold
        self.losses, self.grads = deque(maxlen=window), deque(maxlen=window)

    def update(self, loss, grad_norm):
        return self._push(self.losses, float(loss)), self._push(self.grads, float(grad_norm))

    def _push(self, values, x):
        if not math.isfinite(x):
            return math.inf
        z = math.nan
        if len(values) == self.window:
            mean = math.fsum(values) / len(values)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
            if std > 0:
                z = (x - mean) / std
            else:
                z = 0.0 if x == mean else math.copysign(math.inf, x - mean)
        values.append(x)
        return z

    def is_spike(self, z_loss, z_grad):
        return z_loss > self.z_threshold or z_grad > self.z_threshold

    def state_dict(self):
        """Plain lists and numbers: safe for JSON and torch.load(weights_only=True)."""
        return {"window": self.window, "z_threshold": self.z_threshold,
                "losses": list(self.losses), "grads": list(self.grads)}

    def load_state_dict(self, state):
        self.__init__(state["window"], state["z_threshold"])
        self.losses.extend(state["losses"])
        self.grads.extend(state["grads"])


class DivergenceCheck:
    """A run has diverged when, after a step's backward (before its optimizer step):
    1. the loss or the gradient norm is not finite (grad_norm None: not measured, only the loss is checked);
    2. the loss is above max_loss (None: the first loss checked plus `margin`) on `patience` steps in a row
       (one step above it is a spike, which the SpikeMonitor reports; a divergence stays up);
    3. the mean of the last `window` losses is above the best such mean by more than `gap` (0: off): a
       loss that blows up, or stalls far above its best, which is how float32 runs fail at high LR.
    NormFormer (arXiv v1 §4, Table 3; final §6, Fig. 5) runs the LR ramp until this point and reports the step and
    LR."""

    def __init__(self, max_loss=None, margin=1.0, gap=1.5, window=10, tail=20, patience=3):
        self.max_loss, self.margin, self.gap, self.patience = max_loss, margin, gap, patience
        self.above = 0
        self.recent, self.tail = deque(maxlen=window), deque(maxlen=tail)
        self.best_mean = math.inf

    def check(self, loss, grad_norm):
        """The reason the run diverged at this step (one line), or None."""
        self.tail.append(loss)
        if not (math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))):
            return f"non-finite loss ({loss}) or gradient norm ({grad_norm})"
        if self.max_loss is None:
            self.max_loss = loss + self.margin
        self.above = self.above + 1 if loss > self.max_loss else 0
        if self.above >= self.patience:
            return f"loss {loss:.4f} above the bound {self.max_loss:.4f} for {self.above} steps"
        self.recent.append(loss)
        if len(self.recent) == self.recent.maxlen:
            mean = math.fsum(self.recent) / len(self.recent)
            if self.gap and mean > self.best_mean + self.gap:
                return f"mean loss of the last {len(self.recent)} steps {mean:.4f} is {mean - self.best_mean:.2f} " \
                       f"above its best {self.best_mean:.4f} (gap {self.gap})"
            self.best_mean = min(self.best_mean, mean)
        return None

    def state_dict(self):
        return {"max_loss": self.max_loss, "best_mean": self.best_mean, "above": self.above,
                "recent": list(self.recent), "tail": list(self.tail)}

    def load_state_dict(self, state):
        self.max_loss, self.best_mean, self.above = state["max_loss"], state["best_mean"], state["above"]
        self.recent.extend(state["recent"])
        self.tail.extend(state["tail"])


def _first_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _part(x, chunk):
    return x if chunk is None else x.chunk(chunk[1], dim=-1)[chunk[0]]


class ProbePoint(NamedTuple):
    """Where a probe hooks a model: the tensor that module (a name from named_modules) takes ("input", a forward
    pre-hook) or gives ("output", a forward hook), or its chunk (index, count), tensor.chunk(count, dim=-1)[index];
    layer and op name it in the records (layer None outside the blocks)."""
    layer: Optional[int]
    op: str
    module: str
    io: str
    chunk: Optional[tuple] = None


class Probe:
    """Records max |x| (and std) of each point's tensor in forward order and, with backward=True, max |grad|
    of each point's tensor in backward order. points: ProbePoints, or plain (layer, op, module, io, chunk)
    tuples."""

    def __init__(self, model, points, backward=False, stats=False):
        modules = dict(model.named_modules())
        points = [ProbePoint(*point) for point in points]
        missing = [p.module for p in points if p.module not in modules]
        if missing:
            raise ValueError(f"Probe: no module named {', '.join(map(repr, missing))} in the model")
        wrong = [p.io for p in points if p.io not in ("output", "input")]
        if wrong:
            raise ValueError(f"Probe: io must be 'output' or 'input', not {wrong[0]!r}")
        self.modules, self.points = modules, points
        self.backward, self.stats = backward, stats
        self.handles, self.pending, self.active, self._records = [], [], False, None

    def __enter__(self):
        self.active = True
        self.handles = [self._install(point) for point in self.points]
        return self

    def __exit__(self, *exc):
        self.active = False
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return False

    def _install(self, point):
        module, chunk = self.modules[point.module], point.chunk

        def record(x):
            self._add(point, "forward", _part(x.detach(), chunk))
            if self.backward and x.requires_grad:
                # Hook the module's own tensor: a chunk taken here is not in the graph and gets no gradient.
                x.register_hook(lambda g: self._add(point, "backward", _part(g, chunk)) if self.active else None)

        if point.io == "input":
            return module.register_forward_pre_hook(lambda m, args: record(args[0]))
        return module.register_forward_hook(lambda m, args, out: record(_first_tensor(out)))

    def _add(self, point, pass_, x):
        stats = [x.abs().amax().float()]
        if self.stats:
            stats.append(x.float().std(correction=0))
        self.pending.append((point, pass_, torch.stack(stats)))
        self._records = None

    @property
    def records(self):
        """The records as Python numbers; the first read after new values syncs with the device once."""
        if self._records is None:
            values = torch.stack([s for _, _, s in self.pending]).tolist() if self.pending else []
            self._records = [_record(point, pass_, v) for (point, pass_, _), v in zip(self.pending, values)]
        return self._records


def _record(point, pass_, values):
    rec = {"layer": point.layer, "op": point.op, "pass": pass_, "module": point.module, "max_abs": values[0]}
    if len(values) > 1:
        rec["std"] = values[1]
    return rec


def first_overflow(records, limit=FP16_MAX):
    """The first record, forward ones first, whose max |x| is non-finite or above `limit`; None if none."""
    ordered = [r for r in records if r["pass"] == "forward"] + [r for r in records if r["pass"] == "backward"]
    return next((r for r in ordered if not math.isfinite(r["max_abs"]) or r["max_abs"] > limit), None)


def find_first_overflow(model, points, run_micro_batch, limit=FP16_MAX):
    """Runs run_micro_batch() (forward + backward of the failing micro-batch, from the pre-step state) under
    a Probe with backward hooks and returns (first overflowing record or None, all records). A RuntimeError
    from the closure (e.g. a NaN check in backward) is caught: the records up to it remain. The caller
    restores parameters, buffers and .grad afterwards."""
    with Probe(model, points, backward=True) as probe:
        try:
            run_micro_batch()
        except RuntimeError:
            pass
    return first_overflow(probe.records, limit), probe.records


def headroom(records):
    """max |x| per (layer, op, pass) over all records (e.g. several micro-batches), in first-seen order;
    a NaN anywhere stays NaN."""
    out = {}
    for r in records:
        key = (r["layer"], r["op"], r["pass"])
        old = out.get(key, -math.inf)
        new = r["max_abs"]
        out[key] = old if math.isnan(old) or (new <= old) else new
    return [{"layer": k[0], "op": k[1], "pass": k[2], "max_abs": v} for k, v in out.items()]


def layer_of(name, layer_re=LAYER_RE):
    match = re.search(layer_re, name)
    return int(match.group(1)) if match else None


def _op(name, label):
    return label(name) if label else name.rsplit(".", 1)[0]


def _split(t, n):
    if t is None or n == 1:
        return [t] * n
    return t.chunk(n, dim=0)


def _read(rows):
    """rows: (fields, {key: 0-dim tensor}). Reads every tensor with one host sync into the fields."""
    tensors = [t.float() for _, stats in rows for t in stats.values()]
    values = iter(torch.stack(tensors).tolist() if tensors else [])
    return [dict(fields, **{k: next(values) for k in stats}) for fields, stats in rows]


def weight_stats(model, before=None, splits=None, layer_re=LAYER_RE, label=None):
    """Per parameter with a .grad (per part for fused matrices in `splits`, {name suffix: labels}, split
    along dim 0): the gradient's L2 norm and mean |g|, and with `before` (name -> weights before
    optimizer.step, e.g. snapshot(model)) the update/weight ratio ||W_after - W_before|| / ||W_before||."""
    rows = []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        labels = next((v for k, v in (splits or {}).items() if name.endswith(k)), None)
        ops = labels or [_op(name, label)]
        w0 = None if before is None else before.get(name)
        n = len(ops)
        for op, g, w, w_before in zip(ops, _split(p.grad, n), _split(p.detach(), n), _split(w0, n)):
            g = g.float()
            stats = {"grad_l2": g.norm(), "grad_mean_abs": g.abs().mean()}
            if w_before is not None:
                w_before = w_before.float()
                stats["update_ratio"] = (w.float() - w_before).norm() / w_before.norm()
            rows.append(({"layer": layer_of(name, layer_re), "op": op, "name": name, "update_ratio": None}, stats))
    return _read(rows)


def gain_stats(model, layer_re=LAYER_RE, label=None):
    """mean, population std, min, max of every parameter with dim <= 1 (norm gains and shifts, HeadScale,
    ResScale lambda, LayerScale): NormFormer Fig. 4."""
    rows = []
    for name, p in model.named_parameters():
        if p.dim() <= 1:
            w = p.detach().float()
            stats = {"mean": w.mean(), "std": w.std(correction=0), "min": w.min(), "max": w.max()}
            rows.append(({"layer": layer_of(name, layer_re), "op": _op(name, label), "name": name}, stats))
    return _read(rows)


def buffer_stats(model, names=("running_psi2", "nu"), layer_re=LAYER_RE, label=None):
    """Per module owning any of the buffers `names` (PowerNorm §3: running psi^2 and nu): <short>_min,
    _mean, _max, _max_abs for each, short = the name without "running_"; None where a module lacks one."""
    rows = []
    for module_name, module in model.named_modules():
        own = dict(module.named_buffers(recurse=False))
        if not any(n in own for n in names):
            continue
        fields = {"layer": layer_of(module_name + ".", layer_re), "name": module_name,
                  "op": label(module_name) if label else module_name}
        stats = {}
        for n in names:
            keys = [f"{n.removeprefix('running_')}_{s}" for s in ("min", "mean", "max", "max_abs")]
            if n in own:
                b = own[n].detach().float()
                stats.update(zip(keys, (b.min(), b.mean(), b.max(), b.abs().max())))
            else:
                fields.update(dict.fromkeys(keys))
        rows.append((fields, stats))
    return _read(rows)


def logit_stats(logits):
    """The output logits' mean, max |logit| and mean log Z, log Z = logsumexp over the vocabulary."""
    x = logits.detach().float()
    mean, max_abs, log_z = torch.stack([x.mean(), x.abs().max(), torch.logsumexp(x, dim=-1).mean()]).tolist()
    return {"mean": mean, "max_abs": max_abs, "mean_log_z": log_z}


def snapshot(model, parameters=True):
    """Copies of the buffers (and parameters unless parameters=False), by name, to re-run from this state."""
    tensors = list(model.named_buffers()) + (list(model.named_parameters()) if parameters else [])
    return {name: t.detach().clone() for name, t in tensors}


def restore(model, snap):
    """Copies a snapshot back into the model's parameters and buffers, in place."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, t in snap.items():
            tensors[name].copy_(t)

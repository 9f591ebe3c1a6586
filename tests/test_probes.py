"""
probes.py on a small hand-built model: every expected value is computed directly (statistics.pstdev,
an explicit forward through the submodules, autograd.grad of the intermediates, float64 formulas).
"""

import io
import json
import math
import random
import statistics

import pytest
import torch
from torch import nn

from diagnostics.probes import (FP16_MAX, DivergenceCheck, Probe, SpikeMonitor, buffer_stats, find_first_overflow,
                               first_overflow, gain_stats, headroom, logit_stats, restore, snapshot, weight_stats)

D, V, N_LAYER = 6, 11, 3


class Poison(torch.autograd.Function):
    """Identity forward; an inf gradient backward: a planted backward overflow."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return torch.full_like(g, math.inf)


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.poison = False

    def forward(self, x):
        return Poison.apply(x) if self.poison else x


class Stats(nn.Module):
    """Stands in for a PowerNorm: owns the buffers buffer_stats reads (block 0 has no nu)."""

    def __init__(self, with_nu):
        super().__init__()
        self.register_buffer("running_psi2", torch.rand(D) + 0.5)
        if with_nu:
            self.register_buffer("nu", torch.randn(D))


class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.ln, self.fc1, self.act = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.GELU()
        self.gate, self.fc2 = Gate(), nn.Linear(2 * D, D)
        self.scale = nn.Parameter(torch.tensor(0.9 + 0.1 * i))  # a 0-dim gain, like ResScale's lambda
        self.stats = Stats(with_nu=i > 0)

    def forward(self, x):
        return x * self.scale + self.fc2(self.gate(self.act(self.fc1(self.ln(x)))))


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(5, D)
        self.blocks = nn.ModuleList(Block(i) for i in range(N_LAYER))
        self.final, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.final(h))


def toy():
    torch.manual_seed(0)
    model = Toy()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # random gains and shifts too, not ones and zeros
    return model


def points():
    """Forward order; fc1's output in two chunks, fc2's input beside its output."""
    pts = [(None, "embed", "embed", "output", None)]
    for i in range(N_LAYER):
        b = f"blocks.{i}."
        pts += [(i, "ln", b + "ln", "output", None), (i, "fc1a", b + "fc1", "output", (0, 2)),
                (i, "fc1b", b + "fc1", "output", (1, 2)), (i, "act", b + "act", "output", None),
                (i, "fc2_in", b + "fc2", "input", None), (i, "fc2", b + "fc2", "output", None),
                (i, "resid", f"blocks.{i}", "output", None)]
    return pts + [(None, "logits", "head", "output", None)]


def backward_order():
    """The gradients' order: the reverse of the forward, except that hooks on one tensor (fc1's chunks; act's
    output, which is fc2's input) fire in the order they were registered."""
    order = [(None, "logits")]
    for i in reversed(range(N_LAYER)):
        order += [(i, op) for op in ("resid", "fc2", "act", "fc2_in", "fc1a", "fc1b", "ln")]
    return order + [(None, "embed")]


def explicit_forward(model, x):
    """The toy's forward written out through its submodules, keeping every probed tensor."""
    out = {(None, "embed"): model.embed(x)}
    h = out[(None, "embed")]
    for i, b in enumerate(model.blocks):
        ln = b.ln(h)
        fc1 = b.fc1(ln)
        act = b.act(fc1)
        fc2 = b.fc2(act)
        h = h * b.scale + fc2
        out.update({(i, "ln"): ln, (i, "fc1"): fc1, (i, "act"): act, (i, "fc2"): fc2, (i, "resid"): h})
    out[(None, "logits")] = model.head(model.final(h))
    return out


def views(tensors):
    """Each point's tensor from the explicit forward's tensors (or their gradients)."""
    out = dict(tensors)
    for i in range(N_LAYER):
        out[(i, "fc1a")], out[(i, "fc1b")] = tensors[(i, "fc1")].chunk(2, dim=-1)
        out[(i, "fc2_in")] = tensors[(i, "act")]
    return out


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, V, generator=g)


def no_hooks(model):
    return all(not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
               for m in model.modules())


def test_monitor_matches_hand_computation():
    rng = random.Random(0)
    losses = [3.0 - 0.01 * t + rng.gauss(0, 0.05) for t in range(40)]
    grads = [1.0 + rng.gauss(0, 0.2) for t in range(40)]
    window = 7
    monitor = SpikeMonitor(window=window, z_threshold=2.5)
    for t, (loss, grad) in enumerate(zip(losses, grads)):
        z = monitor.update(loss, grad)
        for series, value, got in ((losses, loss, z[0]), (grads, grad, z[1])):
            if t < window:
                assert math.isnan(got)
            else:
                prev = series[t - window:t]
                assert got == pytest.approx((value - statistics.mean(prev)) / statistics.pstdev(prev), rel=1e-12)
    assert not monitor.is_spike(math.nan, math.nan)
    assert monitor.is_spike(*monitor.update(losses[-1] + 1.0, grads[-1]))
    assert monitor.is_spike(*monitor.update(losses[-1], grads[-1] + 10.0))
    assert not monitor.is_spike(2.4, -30.0)


def test_monitor_non_finite_is_a_spike_and_stays_out_of_the_window():
    rng = random.Random(1)
    values = [rng.random() for _ in range(30)]
    clean, dirty = SpikeMonitor(window=5), SpikeMonitor(window=5)
    for t, v in enumerate(values):
        if t == 12:
            z = dirty.update(math.nan, math.inf)
            assert z == (math.inf, math.inf) and dirty.is_spike(*z)
        assert clean.update(v, v) == dirty.update(v, v) or t < 5
    flat = SpikeMonitor(window=3)
    for v in (2.0, 2.0, 2.0):
        flat.update(v, v)
    assert flat.update(2.0, 3.0) == (0.0, math.inf)


def test_monitor_resumes_exactly():
    rng = random.Random(2)
    series = [(rng.gauss(3, 0.1), rng.gauss(1, 0.3)) for _ in range(30)]
    whole, first = SpikeMonitor(window=6), SpikeMonitor(window=6)
    expected = [whole.update(*s) for s in series]
    for s in series[:13]:
        first.update(*s)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    for state in (json.loads(json.dumps(first.state_dict())), torch.load(buffer, weights_only=True)):
        resumed = SpikeMonitor(window=99, z_threshold=1.0)
        resumed.load_state_dict(state)
        assert resumed.z_threshold == 5.0
        assert [resumed.update(*s) for s in series[13:]] == expected[13:]


def test_probe_forward_records_each_point_in_forward_order():
    model, (x, _) = toy(), batch()
    with Probe(model, points(), stats=True) as probe:
        model(x)
    with torch.no_grad():
        direct = views(explicit_forward(model, x))
    assert [(r["layer"], r["op"], r["pass"]) for r in probe.records] == [(p[0], p[1], "forward") for p in points()]
    for r in probe.records:
        t = direct[(r["layer"], r["op"])].double()
        assert r["max_abs"] == pytest.approx(t.abs().max().item(), rel=1e-6)
        assert r["std"] == pytest.approx(statistics.pstdev(t.flatten().tolist()), rel=1e-5)
    assert no_hooks(model)


def test_probe_backward_records_the_gradients_in_backward_order():
    model, (x, w) = toy(), batch()
    with Probe(model, points(), backward=True) as probe:
        (model(x) * w).sum().backward()
    tensors = explicit_forward(model, x)
    keys = list(tensors)
    grads = views(dict(zip(keys, torch.autograd.grad((tensors[(None, "logits")] * w).sum(), list(tensors.values())))))
    backward = [r for r in probe.records if r["pass"] == "backward"]
    assert [(r["layer"], r["op"]) for r in backward] == backward_order()
    for r in backward:
        assert r["max_abs"] == pytest.approx(grads[(r["layer"], r["op"])].abs().max().item(), rel=1e-6)


def test_probe_removes_every_hook_and_ignores_a_later_backward():
    model, (x, w) = toy(), batch()
    with pytest.raises(KeyError):
        with Probe(model, points(), backward=True) as probe:
            loss = (model(x) * w).sum()
            raise KeyError("user code fails inside the probe")
    assert no_hooks(model)
    n = len(probe.records)
    loss.backward()
    assert len(probe.records) == n
    with pytest.raises(ValueError, match="blocks.7.fc1"):
        Probe(model, points() + [(7, "fc1", "blocks.7.fc1", "output", None)])
    with pytest.raises(ValueError, match="sideways"):
        Probe(model, [(0, "fc1", "blocks.0.fc1", "sideways", None)])


def test_first_overflow_names_the_first_forward_op_over_the_limit():
    model, (x, w) = toy(), batch()
    with torch.no_grad():
        model.blocks[2].fc1.weight.mul_(1e6)
    first, records = find_first_overflow(model, points(), lambda: (model(x) * w).sum().backward())
    assert (first["layer"], first["op"], first["pass"], first["module"]) == (2, "fc1a", "forward", "blocks.2.fc1")
    assert first["max_abs"] > FP16_MAX
    earlier = records[:records.index(first)]
    assert len(earlier) == 1 + 2 * 7 + 1 and all(r["max_abs"] <= FP16_MAX for r in earlier)
    assert first_overflow(records, limit=math.inf) is None
    assert no_hooks(model)


def test_first_overflow_names_a_backward_op_for_a_planted_inf():
    model, (x, w) = toy(), batch()
    model.blocks[1].gate.poison = True
    first, records = find_first_overflow(model, points(), lambda: (model(x) * w).sum().backward())
    assert (first["layer"], first["op"], first["pass"], first["max_abs"]) == (1, "act", "backward", math.inf)
    assert all(r["max_abs"] <= FP16_MAX for r in records if r["pass"] == "forward")
    assert no_hooks(model)


def test_first_overflow_checks_every_forward_record_before_any_backward_one():
    records = [{"layer": 0, "op": "a", "pass": "forward", "max_abs": 1.0},
               {"layer": 0, "op": "a", "pass": "backward", "max_abs": math.nan},
               {"layer": 1, "op": "b", "pass": "forward", "max_abs": 7e4}]
    assert first_overflow(records) is records[2]
    assert first_overflow(records, limit=1e5) is records[1]


def test_find_first_overflow_survives_a_failing_closure():
    model, (x, _) = toy(), batch()

    def run():
        model(x)
        raise RuntimeError("Function 'MulBackward0' returned nan values")

    first, records = find_first_overflow(model, points(), run)
    assert first is None and len(records) == len(points())
    assert no_hooks(model)


def test_headroom_is_the_max_per_op_over_micro_batches():
    model, (x, _) = toy(), batch()
    with Probe(model, points()) as probe:
        model(x)
        model(2 * x)
    rows = headroom(probe.records)
    n = len(points())
    assert [(r["layer"], r["op"], r["pass"]) for r in rows] == [(p[0], p[1], "forward") for p in points()]
    for row, a, b in zip(rows, probe.records[:n], probe.records[n:]):
        assert row["max_abs"] == max(a["max_abs"], b["max_abs"])
    nan = headroom([{"layer": 0, "op": "q", "pass": "forward", "max_abs": v} for v in (1.0, math.nan, 2.0)])
    assert math.isnan(nan[0]["max_abs"])


def test_weight_stats_equal_direct_norms_and_update_ratios():
    model, (x, w) = toy(), batch()
    (model(x) * w).sum().backward()
    model.final.zero_grad(set_to_none=True)
    before = snapshot(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.1 * p.grad + 0.01 * torch.randn_like(p))  # not parallel to the gradient
    rows = weight_stats(model, before=before, splits={"fc1.weight": ("up", "gate")}, label=parent_name)
    params = dict(model.named_parameters())
    expected = []
    for name, p in params.items():
        if p.grad is None:
            continue
        parts = ("up", "gate") if name.endswith("fc1.weight") else (parent_name(name),)
        for op, g, w1, w0 in zip(parts, *(t.double().chunk(len(parts), 0) if t.dim() else [t.double()]
                                         for t in (p.grad, p.detach(), before[name]))):
            expected.append((name, op, g.norm().item(), g.abs().mean().item(), ((w1 - w0).norm() / w0.norm()).item()))
    assert [(r["name"], r["op"]) for r in rows] == [e[:2] for e in expected]
    assert not any(r["name"].startswith("final.") for r in rows)
    for r, (_, _, l2, mean_abs, ratio) in zip(rows, expected):
        assert (r["grad_l2"], r["grad_mean_abs"], r["update_ratio"]) == pytest.approx((l2, mean_abs, ratio), rel=1e-5)
    layers = {r["name"]: r["layer"] for r in rows}
    assert layers["blocks.1.fc2.weight"] == 1 and layers["head.weight"] is None
    assert all(r["update_ratio"] is None for r in weight_stats(model))
    assert weight_stats(model)[0]["op"] == "embed"


def test_gain_stats_equal_direct_statistics():
    model = toy()
    rows = gain_stats(model)
    gains = {n: p.detach().double().flatten().tolist() for n, p in model.named_parameters() if p.dim() <= 1}
    assert [r["name"] for r in rows] == list(gains)
    for r in rows:
        v = gains[r["name"]]
        assert (r["mean"], r["std"], r["min"], r["max"]) == pytest.approx(
            (statistics.mean(v), statistics.pstdev(v), min(v), max(v)), rel=1e-5, abs=1e-7)
    assert {r["layer"] for r in rows} == {None, 0, 1, 2}


def test_buffer_stats_equal_direct_statistics():
    model = toy()
    model.blocks[1].stats.nu[2] = -5.0  # max |nu| is not max nu
    model.blocks[2].stats.nu[3] = math.nan
    rows = buffer_stats(model)
    assert [(r["name"], r["layer"]) for r in rows] == [(f"blocks.{i}.stats", i) for i in range(N_LAYER)]
    for i, r in enumerate(rows):
        psi2 = model.blocks[i].stats.running_psi2.double().tolist()
        assert (r["psi2_min"], r["psi2_mean"], r["psi2_max"], r["psi2_max_abs"]) == pytest.approx(
            (min(psi2), statistics.mean(psi2), max(psi2), max(map(abs, psi2))), rel=1e-6)
    assert all(rows[0][k] is None for k in ("nu_min", "nu_mean", "nu_max", "nu_max_abs"))
    nu = model.blocks[1].stats.nu.double().tolist()
    assert (rows[1]["nu_min"], rows[1]["nu_mean"], rows[1]["nu_max"], rows[1]["nu_max_abs"]) == pytest.approx(
        (min(nu), statistics.mean(nu), max(nu), max(map(abs, nu))), rel=1e-6)
    assert math.isnan(rows[2]["nu_mean"])


def test_logit_stats_equal_direct_statistics():
    logits = 5 * torch.randn(2, 3, V, generator=torch.Generator().manual_seed(3))
    rows = logits.double().reshape(-1, V).tolist()
    flat = [v for row in rows for v in row]
    log_z = [math.log(math.fsum(math.exp(v) for v in row)) for row in rows]
    got = logit_stats(logits)
    assert (got["mean"], got["max_abs"], got["mean_log_z"]) == pytest.approx(
        (statistics.mean(flat), max(map(abs, flat)), statistics.mean(log_z)), rel=1e-5, abs=1e-6)


def test_snapshot_restores_parameters_and_buffers():
    model = toy()
    saved = {n: t.clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    snap = snapshot(model)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.add_(1.0)
    restore(model, snap)
    for n, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert torch.equal(t, saved[n]), n
    assert set(snapshot(model, parameters=False)) == {n for n, _ in model.named_buffers()}


def test_divergence_non_finite_loss_or_gradient():
    for loss, grad in ((math.nan, 1.0), (2.0, math.inf), (-math.inf, 1.0)):
        check = DivergenceCheck()
        assert check.check(3.0, 1.0) is None
        assert "non-finite" in check.check(loss, grad)


def test_divergence_loss_bound_defaults_to_first_loss_plus_margin():
    check = DivergenceCheck(margin=0.5, gap=0, patience=2)
    assert check.check(5.0, 1.0) is None  # the bound becomes 5.5
    assert check.check(9.0, 1.0) is None  # one step above it is a spike
    assert check.check(5.5, 1.0) is None  # at the bound is not above it, and the count restarts
    assert check.check(5.51, 1.0) is None
    assert "above the bound 5.5000 for 2 steps" in check.check(5.6, 1.0)
    explicit = DivergenceCheck(max_loss=2.0, gap=0, patience=1)
    assert explicit.check(1.9, 1.0) is None and explicit.check(2.1, 1.0) is not None


def test_divergence_gap_over_the_best_windowed_mean():
    check = DivergenceCheck(gap=1.0, window=3)
    losses = [5.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.5]  # window means: 4, 3, 2, 1.5, 5/3 (best 1.5)
    assert all(check.check(x, 1.0) is None for x in losses)  # mean (1, 1.5, 2.5) = 5/3 < 1.5 + 1
    assert check.check(3.0, 1.0) is None  # mean (1.5, 2.5, 3) = 7/3 <= 2.5
    reason = check.check(3.6, 1.0)  # mean (2.5, 3, 3.6) = 3.033 > 2.5
    assert reason is not None and "above its best 1.5000" in reason
    off = DivergenceCheck(max_loss=100.0, gap=0, window=3)
    assert all(off.check(x, 1.0) is None for x in (1.0, 1.0, 1.0, 9.0, 9.0, 9.0))
    # "more than gap": a mean exactly gap above the best has not diverged (binary fractions: exact sums)
    edge = DivergenceCheck(max_loss=100.0, gap=1.5, window=1)
    assert edge.check(2.0, 1.0) is None and edge.check(3.5, 1.0) is None and edge.check(3.75, 1.0) is not None


def test_divergence_state_round_trip_and_tail():
    a = DivergenceCheck(gap=1.0, window=3, tail=4)
    for x in (5.0, 4.0, 3.0, 2.0, 1.0):
        a.check(x, 1.0)
    b = DivergenceCheck(gap=1.0, window=3, tail=4)
    b.load_state_dict(torch.load(io.BytesIO(_saved(a.state_dict())), weights_only=True))
    for x in (2.0, 2.9, 3.5):
        assert a.check(x, 1.0) == b.check(x, 1.0)
    assert list(a.tail) == list(b.tail) == [1.0, 2.0, 2.9, 3.5]


def _saved(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def parent_name(name):
    """"blocks.0.fc1.weight" -> "fc1": the label of a parameter in these tests."""
    return name.split(".")[-2]

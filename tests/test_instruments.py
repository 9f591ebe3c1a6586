"""The loss-spike instruments wired into train.py (LR ramp, divergence, first-overflow forensics, spike monitor,
telemetry, z-loss, sequence-length warmup), end to end on a tiny corpus, each checked
against a quantity computed here independently (from checkpoints, .grad, an explicit q@k, a formula)."""

import os

import pytest
import torch
import torch.nn.functional as F

import data
import model
from diagnostics import probes
import configs
from diagnostics.instruments import Instruments
import train
from conftest import events, run, run_train, tiny
import json
import math

TINY = tiny(block_size=16, eval_iters=1, warmup_iters=0)


def test_ramp_schedule_values():
    tc = configs.TrainConfig(lr=0.1, max_iters=1000, lr_schedule="ramp", warmup_iters=50)
    assert [train.get_lr(s, tc) for s in (0, 1, 500, 1000)] == [0.0, 0.1 / 1000, 0.05, 0.1]


def test_loss_bound_stops_before_the_first_update(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, *TINY, "--max_iters=6", "--eval_interval=2", "--diverge_loss=1.0") == 3
    out = tmp_path / "out"
    [event] = events(out, "diverged")  # above the bound on 3 steps in a row: steps 0, 1 and 2
    assert event["step"] == 2 and event["steps_survived"] == 2 and "above the bound 1.0000" in event["reason"]
    assert len(event["loss_tail"]) == 3 and min(event["loss_tail"]) > 1.0
    assert "q@k needs --attn_impl=manual" in event["note"]
    assert [n for n in os.listdir(out) if n.startswith("ckpt")] == ["ckpt-2.pt", "ckpt.pt"] or \
        sorted(n for n in os.listdir(out) if n.startswith("ckpt")) == ["ckpt.pt"]
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2  # the eval before the diverged update
    assert capsys.readouterr().out.count("diverged at step 2") == 1


@pytest.mark.slow
def test_gap_rule_and_default_bound_come_from_the_run(corpus, tmp_path):
    """A loss that rises: the ramp to an absurd LR without clipping, in float32, stops with the gap rule
    or the default bound (first loss + 1), never running to max_iters."""
    code = run(corpus, tmp_path, *TINY, "--max_iters=200", "--eval_interval=1000", "--lr_schedule=ramp", "--lr=20",
               "--grad_clip=0", "--diverge_gap=0.5")
    assert code == 3
    [event] = events(tmp_path / "out", "diverged")
    assert event["step"] < 200 and event["lr"] == pytest.approx(20 * event["step"] / 200)
    losses = [e["loss"] for e in events(tmp_path / "out", "train")]
    assert losses and event["loss_tail"][-2] == pytest.approx(losses[-1])


def plant(factor, where):
    """Multiply a weight of the freshly initialized model, so that forensics has something to find."""
    original = model.GPT.init_weights

    @torch.no_grad()
    def init_weights(self):
        original(self)
        where(self).mul_(factor)
    return init_weights


@pytest.mark.parametrize("factor, where, expected", [
    (1e7, lambda m: m.blocks[1].mlp.proj.weight, ("fc2", 1)),
    (3e3, lambda m: m.blocks[1].attn.qkv.weight[:64], ("q@k", 1)),  # W_q and W_k of layer 1: q, k stay in range
])
def test_forensics_names_the_planted_op_and_layer(corpus, tmp_path, monkeypatch, factor, where, expected):
    monkeypatch.setattr(model.GPT, "init_weights", plant(factor, where))
    assert run(corpus, tmp_path, *TINY, "--max_iters=4", "--attn_impl=manual", "--diverge_loss=1.0") == 3
    [event] = events(tmp_path / "out", "diverged")
    failed = event["failed_op"]
    assert (failed["op"], failed["layer"], failed["pass"]) == (*expected, "forward")
    assert failed["max_abs"] > probes.FP16_MAX


def test_forensics_names_a_backward_op_for_an_inf_gradient(corpus, tmp_path, monkeypatch):
    forward = model.GPT.forward

    def huge_loss(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return logits, loss * 1e30  # finite, but its gradient into the logits is far above 65504
    monkeypatch.setattr(model.GPT, "forward", huge_loss)
    assert run(corpus, tmp_path, *TINY, "--max_iters=2", "--diverge_loss=1e40") == 3  # the gradient norm is not finite
    failed = events(tmp_path / "out", "diverged")[0]["failed_op"]
    assert failed["pass"] == "backward" and failed["op"] == "logits"


def test_telemetry_equals_direct_computation(corpus, tmp_path):
    flags = ["--max_iters=2", "--eval_interval=1", "--keep_checkpoints=3", "--attn_impl=manual",
             "--telemetry_interval=2", "--fp16_headroom_interval=2", "--scale_heads", "--norm=powernorm"]
    assert run(corpus, tmp_path, *TINY, *flags) == 0
    out = tmp_path / "out"
    [event] = events(out, "telemetry")
    before = torch.load(out / "ckpt-1.pt", weights_only=True)["model"]
    after_state = torch.load(out / "ckpt-2.pt", weights_only=True)
    after = after_state["model"]
    # the update/weight ratio of every (split) weight, from the checkpoints of steps 1 and 2
    assert {row["op"] for row in event["weights"]} >= {"q", "k", "v", "out_proj", "fc1", "fc2", "attn_ln"}
    for row in event["weights"]:
        w0, w1 = before[row["name"]], after[row["name"]]
        if row["op"] in ("q", "k", "v"):
            w0, w1 = (w.chunk(3)["qkv".index(row["op"])] for w in (w0, w1))
        if w0.norm() == 0:  # biases start at 0
            continue
        expected = ((w1 - w0).norm() / w0.norm()).item()
        assert row["update_ratio"] == pytest.approx(expected, rel=1e-4, abs=1e-9), row["name"]
    # gains: HeadScale and norm gains from the parameters
    gains = {row["name"]: row for row in event["gains"]}
    head_scale = after["blocks.1.attn.head_scale"].double()
    assert gains["blocks.1.attn.head_scale"]["mean"] == pytest.approx(head_scale.mean().item())
    assert gains["blocks.1.attn.head_scale"]["max"] == pytest.approx(head_scale.max().item())
    # PowerNorm internals: nu of layer 0's attention norm
    psi = {row["name"]: row for row in event["norm_stats"]}
    nu = after["blocks.0.attn_norm.nu"]
    assert psi["blocks.0.attn_norm"]["nu_max_abs"] == pytest.approx(nu.abs().max().item(), rel=1e-5)
    # the attention logits of the step's last micro-batch, from an explicit q@k on the step-2 weights
    cfg = model.GPTConfig(**after_state["model_config"])
    gpt = model.GPT(cfg)
    gpt.load_state_dict(after)
    [folder] = [p for p in (tmp_path / "data").iterdir() if p.is_dir()]
    x, y = data.get_batch(folder, "train", 4, 16, train.batch_generator(1337, 0, 1, 0), "cpu")
    scores = []
    hooks = [block.attn.scores.register_forward_hook(lambda m, i, o: scores.append(o.abs().max().item()))
             for block in gpt.blocks]
    logits, _ = gpt(x, y)
    for h in hooks:
        h.remove()
    expected = [{"layer": i, "value": pytest.approx(s, rel=1e-5)} for i, s in enumerate(scores)]
    assert event["attn_logit_max"] == expected
    assert event["logits"]["mean_log_z"] == pytest.approx(torch.logsumexp(logits, -1).mean().item(), rel=1e-5)
    [headroom] = events(out, "headroom")
    ops = {(r["layer"], r["op"], r["pass"]) for r in headroom["ops"]}
    assert (0, "q@k", "forward") in ops and (1, "fc2", "backward") in ops


@pytest.mark.slow
def test_instruments_leave_training_unchanged(corpus, tmp_path):
    """Hooked passes restore weights, buffers, gradients and the RNG: dropout and PowerNorm still train
    exactly as without them."""
    flags = ["--max_iters=4", "--eval_interval=4", "--dropout=0.1", "--norm=powernorm"]
    assert run(corpus, tmp_path, *TINY, *flags, out="plain") == 0
    assert run(corpus, tmp_path, *TINY, *flags, "--telemetry_interval=1", "--fp16_headroom_interval=2",
               out="probed") == 0
    plain = torch.load(tmp_path / "plain" / "ckpt.pt", weights_only=True)["model"]
    probed = torch.load(tmp_path / "probed" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(plain[k], probed[k]) for k in plain)


@pytest.mark.slow
def test_skip_spikes_skips_the_flagged_steps_and_resumes_exactly(corpus, tmp_path):
    flags = ["--eval_interval=1", "--keep_checkpoints=20", "--spike_window=3", "--spike_z=0.5", "--skip_spikes",
             "--lr_schedule=constant"]
    assert run(corpus, tmp_path, *TINY, "--max_iters=10", *flags, out="straight") == 0
    assert run(corpus, tmp_path, *TINY, "--max_iters=5", *flags, out="split") == 0
    assert run(corpus, tmp_path, *TINY, "--max_iters=10", "--resume", *flags, out="split") == 0
    spikes = events(tmp_path / "straight", "spike")
    assert spikes and all(e["skipped"] for e in spikes) and spikes == events(tmp_path / "split", "spike")
    skipped = {e["step"] for e in spikes}
    states = [torch.load(tmp_path / "straight" / f"ckpt-{s}.pt", weights_only=True)["model"] for s in range(1, 11)]
    for step in range(2, 11):
        same = all(torch.equal(states[step - 2][k], states[step - 1][k]) for k in states[0])
        assert same == (step in skipped), step
    final = torch.load(tmp_path / "split" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(states[-1][k], final[k]) for k in final)


def hooked(gpt):
    return any(m._forward_hooks or m._forward_pre_hooks for m in gpt.modules())


def test_watching_keeps_the_pre_step_buffers_and_leaves_no_hook_behind():
    """Instruments.watching, around a step's forward and backward passes: it keeps the buffers from before them
    (forensics re-runs the step from there), and --fp16_overflow_fails's forward hooks are on during the step
    only, gone after it also when the step fails; the step's peaks are judged (none over 65504 here)."""
    torch.manual_seed(0)
    gpt = model.GPT(model.GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8, vocab_size=32, norm="batchnorm"))
    tc = configs.TrainConfig(fp16_overflow_fails=True, compile=False)
    instruments = Instruments(gpt, tc, lambda event: None, False, torch.autocast("cpu", enabled=False), "cpu")
    before = {name: buffer.clone() for name, buffer in gpt.named_buffers()}
    x = torch.randint(0, 32, (2, 8))
    with instruments.watching(0):
        assert hooked(gpt)
        gpt(x, x)[1].backward()
    assert not hooked(gpt)
    assert any(not torch.equal(buffer, before[name]) for name, buffer in gpt.named_buffers())  # running statistics
    assert instruments.pre_step.keys() == before.keys()
    assert all(torch.equal(instruments.pre_step[name], before[name]) for name in before)
    assert instruments.forward_overflow is None and [step for step, _ in instruments.peaks] == [0]
    with pytest.raises(ZeroDivisionError):
        with instruments.watching(1):
            gpt(x, x)
            1 / 0
    assert not hooked(gpt)


def test_z_loss_value_and_gradient():
    logits = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    log_z = torch.log(torch.exp(logits).sum(-1))
    assert train.z_loss_term(logits).item() == pytest.approx((log_z ** 2).mean().item(), rel=1e-6)
    grad, = torch.autograd.grad(train.z_loss_term(logits), logits)
    # d/dl mean(lse^2) = 2 lse softmax(l) / (number of tokens)
    expected = 2 * log_z.unsqueeze(-1) * F.softmax(logits, -1) / 15
    torch.testing.assert_close(grad.double(), expected.detach(), rtol=1e-5, atol=1e-7)


def test_z_loss_adds_to_the_objective_and_logs_the_cross_entropy(corpus, tmp_path):
    assert run(corpus, tmp_path, *TINY, "--max_iters=1", "--eval_interval=1", "--z_loss=0.5", out="z") == 0
    assert run(corpus, tmp_path, *TINY, "--max_iters=1", "--eval_interval=1", out="plain") == 0
    z_event, plain_event = events(tmp_path / "z", "train")[0], events(tmp_path / "plain", "train")[0]
    assert z_event["loss"] == pytest.approx(plain_event["loss"], rel=1e-6)  # the same CE at the same weights
    assert z_event["z_loss"] > 1.0  # log Z of 256 near-uniform logits is about ln 256 = 5.5
    assert z_event["grad_norm"] != pytest.approx(plain_event["grad_norm"], rel=1e-3)


def test_sequence_warmup_shapes():
    tc = configs.TrainConfig(batch_size=4, seq_warmup_iters=10, seq_warmup_start=4)
    shapes = [train.sequence_shape(s, tc, 64) for s in range(12)]
    assert shapes[0] == (4, 64) and shapes[10] == shapes[11] == (64, 4)
    lengths = [length for length, _ in shapes]
    assert lengths == [4 + 60 * s // 10 for s in range(10)] + [64, 64]
    assert all(64 * 4 - length < length * batch <= 64 * 4 for length, batch in shapes)


def test_sequence_warmup_trains_and_logs_lengths(corpus, tmp_path):
    assert run(corpus, tmp_path, *TINY, "--max_iters=4", "--eval_interval=4", "--seq_warmup_iters=4",
               "--seq_warmup_start=4") == 0
    assert [e["seq_len"] for e in events(tmp_path / "out", "train")] == [4, 7, 10, 13]


# --fp16_overflow_fails (NormFormer arXiv v1 §4, Table 3; final §6, Table 8: runs fail by float16 overflow): on a
# float32 run, diverged at the first step whose forward passes put an op's output above 65504 or non-finite, with
# that op and layer named from the step itself; the criterion that ended a run named in its diverged event; and,
# where no op crossed 65504, the op whose max |x| grew the most over the last steps.

FP16_TINY = tiny(block_size=16, eval_iters=1, warmup_iters=0, grad_accum=1, max_iters=6, eval_interval=3,
            dtype="float32", device="cpu")


PLANTED_STEP = 4  # the step (0-based, as the diverged event counts) whose forward pass plants the value


LAST_STEP = 12  # Grow: the loss bound ends the run here, after GROWTH_WINDOW = 10 steps of growth and more


class Plant:
    """A forward hook on layer 1's fc1 that sets one pre-activation to -value at the training forward pass of
    PLANTED_STEP and to -65000 (inside the float16 range) at every other one. GELU(-65000) is 0 to float32
    precision, so the loss is unchanged and only the criterion sees the planted value."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self, module, args, out):
        if not module.training:  # evaluation passes do not count as steps
            return None
        out = out.clone()
        out[0, 0, 0] = -self.value if self.calls == PLANTED_STEP else -65000.0
        self.calls += 1
        return out


class Grow:
    """A forward hook on layer 1's fc1 that sets one pre-activation to -10 * 2^t at training step t (t <= LAST_STEP:
    at most 40960, inside the float16 range; GELU makes it 0, so the loss is unchanged), recording each value, and
    from step LAST_STEP - 2 on adds 60 to every logit of token 0, which the corpus never has, so that the loss is
    above --diverge_loss=20 on steps 10, 11 and 12 and the loss bound (the gap rule off) ends the run at step 12."""

    def __init__(self):
        self.planted, self.calls = [], 0

    def fc1(self, module, args, out):
        if not module.training:
            return None
        out = out.clone()
        out[0, 0, 0] = -10.0 * 2 ** min(len(self.planted), LAST_STEP)
        self.planted.append(-out[0, 0, 0].item())
        return out

    def logits(self, module, args, out):
        if not module.training:
            return None
        self.calls += 1
        if self.calls <= LAST_STEP - 2:
            return None
        out = out.clone()
        out[..., 0] += 60.0
        return out


def train_planted(corpus, tmp_path, monkeypatch, hooks, flags):
    """train.main with forward hooks {module name: hook} on the model, before the criterion's (they see their
    output); the exit code and the diverged events."""
    def planted_gpt(cfg):
        gpt = model.GPT(cfg)
        modules = dict(gpt.named_modules())
        for name, hook in hooks.items():
            modules[name].register_forward_hook(hook)
        return gpt

    monkeypatch.setattr(train, "GPT", planted_gpt)
    code = run_train(corpus, tmp_path / "data", tmp_path / "out", *FP16_TINY, *flags)
    with open(tmp_path / "out" / "log.jsonl") as f:
        diverged = [e for e in map(json.loads, f) if e["event"] == "diverged"]
    return code, diverged


def run_planted(corpus, tmp_path, monkeypatch, value, *flags):
    plant = Plant(value)
    code, diverged = train_planted(corpus, tmp_path, monkeypatch, {"blocks.1.mlp.fc": plant}, flags)
    return code, diverged, plant


def run_grown(corpus, tmp_path, monkeypatch, *flags):
    grow = Grow()
    hooks = {"blocks.1.mlp.fc": grow.fc1, "lm_head": grow.logits}
    code, diverged = train_planted(corpus, tmp_path, monkeypatch, hooks,
                                   ["--max_iters=20", "--diverge_loss=20", "--diverge_gap=0", *flags])
    return code, diverged, grow


@pytest.mark.slow
def test_stops_at_the_planted_step_and_names_its_op(corpus, tmp_path, monkeypatch, capsys):
    code, [event], plant = run_planted(corpus, tmp_path, monkeypatch, 70000.0, "--fp16_overflow_fails=True")
    assert code == 3 and event["step"] == PLANTED_STEP and event["steps_survived"] == PLANTED_STEP
    assert event["criterion"] == "fp16 overflow"
    # the value of that step's own forward pass: a re-run would see -65000 (the plant's later calls)
    assert event["failed_op"] == {"layer": 1, "op": "fc1", "pass": "forward", "module": "blocks.1.mlp.fc",
                                  "max_abs": 70000.0}
    assert plant.calls == PLANTED_STEP + 1  # nothing re-ran the step
    assert event["grew_most"] is None  # an op did cross 65504: the window of steps 0-4 is not read
    assert "fc1 at layer 1" in event["reason"] and "65504" in event["reason"]
    assert f"diverged at step {PLANTED_STEP}" in capsys.readouterr().out


@pytest.mark.slow
def test_non_finite_output_fails_too(corpus, tmp_path, monkeypatch):
    code, [event], _ = run_planted(corpus, tmp_path, monkeypatch, float("nan"), "--fp16_overflow_fails=True")
    assert code == 3 and event["step"] == PLANTED_STEP and event["criterion"] == "fp16 overflow"
    assert event["failed_op"]["op"] == "fc1" and event["failed_op"]["max_abs"] == float("inf")


@pytest.mark.slow
def test_without_the_flag_the_run_does_not_stop_for_it(corpus, tmp_path, monkeypatch):
    code, diverged, plant = run_planted(corpus, tmp_path, monkeypatch, 70000.0)
    assert code == 0 and diverged == [] and plant.calls == 6


def test_other_rules_name_their_criterion(corpus, tmp_path, monkeypatch):
    # a NaN output without the flag: the loss turns non-finite at the same step, a rule of nanonorm's own
    code, [event], _ = run_planted(corpus, tmp_path, monkeypatch, float("nan"))
    assert code == 3 and event["step"] == PLANTED_STEP and event["criterion"] == "non-finite loss"
    assert event["reason"].startswith("non-finite loss")


def test_refused_with_compile(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "GPT", model.GPT)
    code = run_train(corpus, tmp_path / "data", tmp_path / "out", *FP16_TINY, "--fp16_overflow_fails=True",
                     "--compile=True")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["train.py: --fp16_overflow_fails needs --compile=False: its forward hooks see "
                                 "nothing inside torch.compile"]


@pytest.mark.slow
def test_names_the_op_that_grew_the_most_when_none_crossed(corpus, tmp_path, monkeypatch, capsys):
    code, [event], grow = run_grown(corpus, tmp_path, monkeypatch, "--fp16_overflow_fails=True")
    assert code == 3 and event["step"] == LAST_STEP and event["criterion"] == "loss bound"
    assert event["failed_op"] is None
    # the window: the forward passes of steps LAST_STEP - 9 .. LAST_STEP, the diverged step's own the newest
    first, last = grow.planted[LAST_STEP - 9], grow.planted[LAST_STEP]
    assert (first, last) == (10.0 * 2 ** 3, 10.0 * 2 ** 12)
    assert event["grew_most"] == {"layer": 1, "op": "fc1", "module": "blocks.1.mlp.fc", "from": first, "to": last,
                                  "ratio": last / first, "steps": 9}
    out = capsys.readouterr().out
    assert "first op over the float16 range: none (" in out
    assert "grew the most over the last 9 steps: fc1 at layer 1 (max |x| 80 -> 4.1e+04, x512)" in out


@pytest.mark.slow
def test_without_the_flag_nothing_grew_most(corpus, tmp_path, monkeypatch, capsys):
    code, [event], _ = run_grown(corpus, tmp_path, monkeypatch)
    assert code == 3 and event["step"] == LAST_STEP and event["criterion"] == "loss bound"
    assert event["failed_op"] is None and event["grew_most"] is None
    assert "--fp16_overflow_fails names the op whose max |x| grew the most" in event["note"]
    assert "grew the most over" not in capsys.readouterr().out


def nan_when_evaluating(module, args, out):
    return None if module.training else torch.full_like(out, math.nan)


def test_nothing_grew_most_before_two_steps(corpus, tmp_path, monkeypatch):
    # a non-finite validation loss at the step-0 evaluation, before any training step filled the window
    code, [event] = train_planted(corpus, tmp_path, monkeypatch, {"lm_head": nan_when_evaluating},
                                  ["--fp16_overflow_fails=True"])
    assert code == 3 and event["step"] == 0 and event["criterion"] == "non-finite val loss"
    assert event["failed_op"] is None and event["grew_most"] is None

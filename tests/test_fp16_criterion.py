"""--fp16_overflow_fails (NormFormer arXiv v1 §4, Table 3; final §6, Table 8: runs fail by float16 overflow): on a
float32 run, diverged at the first step whose forward passes put an op's output above 65504 or non-finite, with
that op and layer named from the step itself; the criterion that ended a run named in its diverged event; and,
where no op crossed 65504, the op whose max |x| grew the most over the last steps."""

import json
import math

import pytest
import torch

import model
import train
from conftest import run_train, tiny

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

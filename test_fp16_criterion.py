"""--fp16_overflow_fails (NormFormer arXiv v1 §4, Table 3; final §6, Table 8: runs fail by float16 overflow): on a
float32 run, diverged at the first step whose forward passes put an op's output above 65504 or non-finite, with
that op and layer named from the step itself; and the criterion that ended a run named in its diverged event."""

import json
import random

import pytest

import model
import train

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=16", "--batch_size=4", "--eval_iters=1",
        "--log_interval=1", "--warmup_iters=0", "--lr=3e-3", "--grad_accum=1", "--max_iters=6", "--eval_interval=3",
        "--dtype=float32", "--device=cpu"]
PLANTED_STEP = 4  # the step (0-based, as the diverged event counts) whose forward pass plants the value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = random.Random(2)
    words = ["layer", "norm", "overflow", "float", "half", "range", "ramp", "head"]
    path = tmp_path_factory.mktemp("corpus") / "words.txt"
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(300)))
    return str(path)


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


def run(corpus, tmp_path, monkeypatch, value, *flags):
    plant = Plant(value)

    def planted_gpt(cfg):
        gpt = model.GPT(cfg)
        gpt.blocks[1].mlp.fc.register_forward_hook(plant)  # before the criterion's hooks: they see its output
        return gpt

    monkeypatch.setattr(train, "GPT", planted_gpt)
    code = train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                       *TINY, *flags])
    with open(tmp_path / "out" / "log.jsonl") as f:
        diverged = [e for e in map(json.loads, f) if e["event"] == "diverged"]
    return code, diverged, plant


def test_stops_at_the_planted_step_and_names_its_op(corpus, tmp_path, monkeypatch, capsys):
    code, [event], plant = run(corpus, tmp_path, monkeypatch, 70000.0, "--fp16_overflow_fails=True")
    assert code == 3 and event["step"] == PLANTED_STEP and event["steps_survived"] == PLANTED_STEP
    assert event["criterion"] == "fp16 overflow"
    # the value of that step's own forward pass: a re-run would see -65000 (the plant's later calls)
    assert event["failed_op"] == {"layer": 1, "op": "fc1", "pass": "forward", "module": "blocks.1.mlp.fc",
                                  "max_abs": 70000.0}
    assert plant.calls == PLANTED_STEP + 1  # nothing re-ran the step
    assert "fc1 at layer 1" in event["reason"] and "65504" in event["reason"]
    assert f"diverged at step {PLANTED_STEP}" in capsys.readouterr().out


def test_non_finite_output_fails_too(corpus, tmp_path, monkeypatch):
    code, [event], _ = run(corpus, tmp_path, monkeypatch, float("nan"), "--fp16_overflow_fails=True")
    assert code == 3 and event["step"] == PLANTED_STEP and event["criterion"] == "fp16 overflow"
    assert event["failed_op"]["op"] == "fc1" and event["failed_op"]["max_abs"] == float("inf")


def test_without_the_flag_the_run_does_not_stop_for_it(corpus, tmp_path, monkeypatch):
    code, diverged, plant = run(corpus, tmp_path, monkeypatch, 70000.0)
    assert code == 0 and diverged == [] and plant.calls == 6


def test_other_rules_name_their_criterion(corpus, tmp_path, monkeypatch):
    # a NaN output without the flag: the loss turns non-finite at the same step, a rule of nanonorm's own
    code, [event], _ = run(corpus, tmp_path, monkeypatch, float("nan"))
    assert code == 3 and event["step"] == PLANTED_STEP and event["criterion"] == "non-finite loss"
    assert event["reason"].startswith("non-finite loss")


def test_refused_with_compile(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "GPT", model.GPT)
    code = train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}",
                       *TINY, "--fp16_overflow_fails=True", "--compile=True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["train.py: --fp16_overflow_fails needs --compile=False: its forward hooks see "
                                 "nothing inside torch.compile"]

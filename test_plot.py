"""plot.py on real tiny runs and a tiny sweep: every picture is a valid PNG with content; bad input is one line."""

import json
import os
import random

import matplotlib.image
import numpy as np
import pytest

import plot
import sweep
import train
from test_sweep import TINY, corpus  # noqa: F401 (corpus is a fixture)

INSTRUMENTED = {"telemetry_interval", "fp16_headroom_interval"} <= set(train.TrainConfig.__dataclass_fields__)
TELEMETRY_PLOTS = ("grad_norms", "gains", "attn_logits", "powernorm", "headroom")


def append(run_dir, *events):
    with open(os.path.join(run_dir, "log.jsonl"), "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def telemetry(step, rng):
    """One telemetry event in log.jsonl's schema for a 2-layer model (train.py --telemetry_interval)."""
    stats = lambda: dict(zip(("min", "mean", "max"), sorted(rng.uniform(0.5, 1.5) for _ in range(3))))  # noqa: E731
    weights = [{"layer": layer, "op": op, "name": f"blocks.{layer}.{op}.weight", "grad_l2": rng.uniform(0.1, 2),
                "grad_mean_abs": rng.uniform(1e-4, 1e-2), "update_ratio": rng.uniform(1e-4, 1e-2)}
               for layer in (0, 1) for op in ("q", "fc2")]
    gains = [{"layer": layer, "op": op, "name": f"blocks.{layer}.{op}.{kind}", "std": rng.uniform(0, 0.1), **stats()}
             for layer in (0, 1) for op in ("attn_ln", "ffn_ln") for kind in ("weight", "bias")]
    norm_stats = [{"layer": layer, "op": "attn_ln", "name": f"blocks.{layer}.attn_ln",
                   **{f"psi2_{k}": v for k, v in stats().items()}, **{f"nu_{k}": v - 1 for k, v in stats().items()},
                   "nu_max_abs": rng.uniform(0, 1)} for layer in (0, 1)]
    return {"event": "telemetry", "step": step, "weights": weights,
            "acts": [{"layer": 0, "op": "resid_ffn", "std": 1.0, "max_abs": 3.0}],
            "attn_logit_max": [{"layer": layer, "value": rng.uniform(1, 10)} for layer in (0, 1)],
            "logits": {"mean": 0.0, "max_abs": 5.0, "mean_log_z": 5.5}, "gains": gains, "norm_stats": norm_stats}


def headroom(step):
    ops = [{"layer": None, "op": "embed", "pass": "forward", "max_abs": 3.0}]
    ops += [{"layer": layer, "op": op, "pass": p, "max_abs": value} for layer in (0, 1)
            for op, p, value in (("q@k", "forward", 900.0 * (layer + 1)), ("fc2", "forward", 7e4),
                                 ("fc2", "backward", float("inf") if layer else 1e-3))]
    return {"event": "headroom", "step": step, "ops": ops, "fp16_max": 65504.0}


def check_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.shape[2] in (3, 4)
    assert float(np.std(pixels[..., :3])) > 0


@pytest.fixture(scope="module")
def tiny_sweep(corpus, tmp_path_factory):
    """A real 2 variants x 2 LRs sweep layout (train.py in this process), then summarized by sweep.py.
    Events train.py on this branch cannot write yet (spike, diverged, telemetry, headroom) are appended in the
    log.jsonl schema."""
    root = tmp_path_factory.mktemp("plots")
    args = sweep.parse_args(["--variants=baseline,norm=rmsnorm", "--lrs=1e-2,1e-1", f"--out_dir={root / 'sweep'}",
                             f"--dataset={corpus}", f"--data_dir={root / 'data'}", *TINY])
    runs = sweep.grid(args)
    for run in runs:
        os.makedirs(os.path.dirname(run.dir), exist_ok=True)
        with open(run.dir + ".exit", "w") as f:
            f.write(f"{train.main(sweep.train_flags(run, args))}\n")
    append(runs[0].dir, {"event": "spike", "step": 3, "loss": 6.0, "grad_norm": 4.0, "z_loss_score": 6.0,
                         "z_grad_score": 5.5, "skipped": False})
    append(runs[1].dir, {"event": "diverged", "step": 4, "steps_survived": 4, "lr": 0.1, "reason": "loss bound",
                         "loss_tail": [5.0, 9.0], "failed_op": None, "note": ""})
    rng = random.Random(1)
    append(runs[2].dir, telemetry(2, rng), headroom(2), telemetry(4, rng), headroom(4))
    sweep.write_summary(args, runs)
    return root, runs


def test_every_plot_is_a_png_with_content(tiny_sweep, capsys):
    root, runs = tiny_sweep
    assert plot.main([str(root / "sweep"), f"--out={root / 'png'}"]) == 0
    printed = capsys.readouterr().out
    instrumented = plot.slug(os.path.relpath(runs[2].dir, root / "sweep"))
    expected = ["loss.png", "loss_vs_lr_sweep.png"] + [f"{kind}_{instrumented}.png" for kind in TELEMETRY_PLOTS]
    assert sorted(os.listdir(root / "png")) == sorted(expected)
    for name in expected:
        check_png(root / "png" / name)
    assert f"{os.path.relpath(runs[0].dir, root / 'sweep')}: per-layer plots skipped" in printed


def test_run_folders_overlaid(tiny_sweep):
    root, runs = tiny_sweep
    assert plot.main([runs[0].dir, runs[3].dir, f"--out={root / 'two'}"]) == 0
    assert os.listdir(root / "two") == ["loss.png"]
    check_png(root / "two" / "loss.png")


@pytest.mark.skipif(not INSTRUMENTED, reason="train.py has no --telemetry_interval/--fp16_headroom_interval yet")
def test_telemetry_plots_from_a_real_instrumented_run(corpus, tmp_path):
    assert train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}",
                       *TINY, "--norm=powernorm", "--attn_impl=manual", "--telemetry_interval=2",
                       "--fp16_headroom_interval=2"]) == 0
    assert plot.main([str(tmp_path / "run"), f"--out={tmp_path / 'png'}"]) == 0
    for kind in TELEMETRY_PLOTS:
        check_png(tmp_path / "png" / f"{kind}_run.png")


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: [str(tmp / "missing")], "is not a folder"),
    (lambda tmp: [str(tmp)], "holds no log.jsonl"),
    (lambda tmp: [str(tmp), "--colour=red"], "unknown flag --colour"),
    (lambda tmp: [], "no folders given"),
])
def test_bad_input_is_one_line(tmp_path, capsys, make, expected):
    assert plot.main([*make(tmp_path), f"--out={tmp_path / 'png'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plot.py: ") and expected in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "png")

"""plot.py on real tiny runs and a tiny sweep: every picture is a valid PNG with content; bad input (flags, torn or
foreign logs and summaries, an --out that cannot be a folder) is one line; a failed write is one line and no file."""

import contextlib
import errno
import io
import json
import math
import os
import random
import re
import shutil

import matplotlib.pyplot as plt
import pytest

import lab.claims
import lab.results_page
import lab.summary
import lab.tables
import plot
from lab import figures
from lab import recipes
from lab import schema
import sweep
import configs
import train
from conftest import ROOT, SWEEP_TINY, check_png

INSTRUMENTED = {"telemetry_interval", "fp16_headroom_interval"} <= set(configs.TrainConfig.__dataclass_fields__)
TELEMETRY_PLOTS = ("grad_norms", "gains", "attn_logits", "powernorm", "headroom")


def append(run_dir, *events):
    """events added to the run's log where train.py logs them, in step order (a log's steps never go back); a
    step's events already there come first."""
    path = os.path.join(run_dir, "log.jsonl")
    with open(path) as f:
        logged = [json.loads(line) for line in f]
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in sorted(logged + list(events), key=lambda e: e["step"]))


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


@pytest.fixture(scope="module")
def tiny_sweep(corpus, tmp_path_factory):
    """A real 2 variants x 2 LRs sweep layout (train.py in this process), then summarized by sweep.py.
    Events train.py on this branch cannot write yet (spike, diverged, telemetry, headroom) are appended in the
    log.jsonl schema."""
    root = tmp_path_factory.mktemp("plots")
    args = sweep.parse_args(["--variants=baseline,norm=rmsnorm", "--lrs=1e-2,1e-1", f"--out_dir={root / 'sweep'}",
                             f"--dataset={corpus}", f"--data_dir={root / 'data'}", *SWEEP_TINY])
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
    lab.summary.write_summary(args, runs)
    return root, runs


@pytest.mark.slow
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


@pytest.mark.slow
def test_run_folders_overlaid(tiny_sweep):
    root, runs = tiny_sweep
    assert plot.main([runs[0].dir, runs[3].dir, f"--out={root / 'two'}"]) == 0
    assert os.listdir(root / "two") == ["loss.png"]
    check_png(root / "two" / "loss.png")


@pytest.mark.slow
@pytest.mark.skipif(not INSTRUMENTED, reason="train.py has no --telemetry_interval/--fp16_headroom_interval yet")
def test_telemetry_plots_from_a_real_instrumented_run(corpus, tmp_path):
    assert train.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'run'}",
                       *SWEEP_TINY, "--norm=powernorm", "--attn_impl=manual", "--telemetry_interval=2",
                       "--fp16_headroom_interval=2"]) == 0
    assert plot.main([str(tmp_path / "run"), f"--out={tmp_path / 'png'}"]) == 0
    for kind in TELEMETRY_PLOTS:
        check_png(tmp_path / "png" / f"{kind}_run.png")


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: [str(tmp / "missing")], "is not a folder"),
    (lambda tmp: [str(tmp)], "holds no log.jsonl"),
    (lambda tmp: [str(tmp), "--colour=red"], "unknown flag --colour"),
    (lambda tmp: [], "no folders given"),
    (lambda tmp: [str(tmp), str(tmp / ".")], "is given more than once; give each run or sweep folder once"),
])
def test_bad_input_is_one_line(tmp_path, capsys, make, expected):
    assert plot.main([*make(tmp_path), f"--out={tmp_path / 'png'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plot.py: ") and expected in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "png")


@pytest.mark.parametrize("started", ["sweep/baseline/1e-2/0.out", "run/config.json", "run/run.lock"])
def test_a_folder_whose_runs_have_not_logged_yet_is_told_so(tmp_path, capsys, started):
    """Issue 46: plot.py on a sweep that had just started said it "holds no log.jsonl; pass run folders ... or sweep
    folders", which it is: it says that its runs have not logged yet."""
    path = tmp_path / started
    os.makedirs(path.parent)
    path.write_text("")
    given = tmp_path / started.split("/")[0]
    assert plot.main([str(given), f"--out={tmp_path / 'png'}"]) == 2
    assert capsys.readouterr().err == (f"plot.py: {given} holds no log.jsonl yet: its runs have started but logged "
                                       "nothing; plot it once they have\n")
    assert not os.path.exists(tmp_path / "png")


def hand_run(folder, *lines):
    """A run folder with a hand-written log.jsonl: an eval and three train events, then lines (bytes) as given."""
    os.makedirs(folder)
    events = [{"event": "eval", "step": 0, "val_loss": 5.5}] + [
        {"event": "train", "step": step, "loss": 5.0 - step / 10, "lr": 1e-3, "grad_norm": 1.0} for step in (1, 2, 3)]
    with open(folder / "log.jsonl", "wb") as f:
        f.write(b"".join(json.dumps(e).encode() + b"\n" for e in events) + b"".join(lines))
    return folder


def recipe_summary():
    """A ramp recipe's summary.json as sweep.py writes it, holding what the results page reads: 2 variants x 2 seeds,
    every run diverged; the claim judged by lab/claims.py from the runs."""
    variants = ["baseline", "norm=rmsnorm"]
    runs = [{"variant": variant, "lr": "0.5", "seed": seed, "status": "diverged", "diverged": True,
             "final_loss": math.inf, "init_loss": 5.5, "final_loss_capped": 5.5, "peak_lr": 0.2,
             "steps_survived": 30 + 10 * seed + (5 if variant == "norm=rmsnorm" else 0), "spikes": 0,
             "attn_logit_max": None, "log_z": None,
             "curve": [[step, step / 100, 5.0 - step / 50] for step in range(10, 50, 10)], "logit_curve": []}
            for variant in variants for seed in (0, 1)]
    claim = recipes.Claim("norm=rmsnorm", "steps_survived@0.5", "better", "94 vs 200 steps", effect=0.375,
                          effect_source="Table 3", target_origin="paper", relative=True)
    design = {"variants": variants, "lrs": ["0.5"], "seeds": [0, 1], "steps": 50, "test": lab.claims.TEST,
              "family": "the recipe's 1 claim", "power_alpha": 0.05,
              "eval_windows": {"eval_iters": 5, "batch_size": 8, "windows": 40, "block_size": 64, "tokens": 2560}}
    return {"mode": "ramp", "reference": "baseline", "wall_s": 60.0, "runs": runs,
            "recipe": {"name": "tiny", "title": "a tiny ramp", "order": 1, "scale": "cpu", "paper": "A Paper §1",
                       "quote": "It is better.", "reference": "baseline", "figure": "ramp", "variants": variants,
                       "lrs": ["0.5"], "seeds": 2, "deviations": "tiny", "command": "python sweep.py --recipe=tiny",
                       "train_argv": ["--max_iters=50"], "recipe_argv": ["--max_iters=50"],
                       "claims": [vars(claim)], "design": design},
            "claims": lab.claims.judge(runs, [claim], "baseline", ["0.5"]),
            "machine": {"hardware": "2-core CPU", "load": 1.0, "torch": "2.13.0+cpu", "date": "2026-11-24"},
            "comparisons": [],
            "variants": [{"variant": variant, "lr": "0.5", "runs": 2, "diverged": 2, "criterion": "loss gap",
                          "criterion_count": 2, "failed_op": None, "failed_op_count": 0} for variant in variants]}


def write_json(path, value):
    os.makedirs(path.parent, exist_ok=True)
    path.write_text(json.dumps(value))


def assert_one_line(capsys, *expected):
    err = capsys.readouterr().err
    assert err.startswith("plot.py: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err


def test_a_torn_last_line_is_left_out_with_a_note(tmp_path, capsys):
    run = hand_run(tmp_path / "run", b'{"event": "train", "step": 4, "lo')
    assert plot.main([str(run), f"--out={tmp_path / 'png'}"]) == 0
    assert capsys.readouterr().err == (f"plot.py: {run / 'log.jsonl'}:5: the last line was cut short (a killed run); "
                                       "left out\n")
    check_png(tmp_path / "png" / "loss.png")


def test_a_refusal_after_a_torn_line_is_one_line(tmp_path, capsys):
    """The torn line's note is said once every log has been read: a foreign log after it is the one line."""
    hand_run(tmp_path / "sweep" / "a", b'{"event": "train", "step": 4, "lo')
    hand_run(tmp_path / "sweep" / "b", b"not json\n")
    assert plot.main([str(tmp_path / "sweep"), f"--out={tmp_path / 'png'}"]) == 2
    assert_one_line(capsys, "b/log.jsonl:5: not JSON")


def test_a_run_in_a_hidden_folder_is_plotted_and_runs_named_alike_keep_their_own_plots(tmp_path, capsys):
    """--lrs=.01 names a run's folder .01/; "a b" and "a_b" slug alike, as do the same run names in two sweeps."""
    for run in ("sweep/.01/0", "sweep/a b", "sweep/a_b", "other/a_b"):
        hand_run(tmp_path / run, json.dumps(telemetry(4, random.Random(0))).encode() + b"\n")
    assert plot.main([str(tmp_path / "sweep"), str(tmp_path / "other"), f"--out={tmp_path / 'png'}"]) == 0
    capsys.readouterr()
    gains = sorted(path.name for path in (tmp_path / "png").glob("gains_*.png"))
    assert gains == ["gains_.01_0.png", "gains_a_b+1.png", "gains_a_b+2.png", "gains_a_b+3.png"]
    grads = sorted(path.name for path in (tmp_path / "png").glob("grad_norms_*.png"))
    assert grads == [name.replace("gains_", "grad_norms_") for name in gains]
    for name in gains:
        check_png(tmp_path / "png" / name)


@pytest.mark.parametrize("make, expected", [
    (lambda run: hand_run(run, b"not json\n", b'{"event": "train"}\n'), "log.jsonl:5: not JSON"),
    (lambda run: hand_run(run, b'{"event": "train", "step": 4, "loss": 4.0}\n'),
     "log.jsonl:5: train event: lr is missing"),
    (lambda run: hand_run(run, b'{"event": "eval", "step": "4", "val_loss": 4.0}\n'),
     "log.jsonl:5: eval event: step is a string, not an integer"),
    (lambda run: hand_run(run, json.dumps({**telemetry(4, random.Random(0)), "gains": [{"layer": 0}]}).encode()
                          + b"\n"), "log.jsonl:5: telemetry event: gains[0].op is missing"),
    # an integer past 2^63 (a float's range: 10^400), which nanonorm never writes, overflowed the plots
    (lambda run: hand_run(run, b'{"event": "train", "step": 5, "loss": 1' + b"0" * 400 + b', "lr": 0.001}\n'),
     "log.jsonl:5: not JSON"),
    # a layer or op that is not one (a list) could not key a plot's curves
    (lambda run: hand_run(run, json.dumps({**telemetry(4, random.Random(0)), "norm_stats": [
        {**telemetry(4, random.Random(0))["norm_stats"][0], "layer": [0]}]}).encode() + b"\n"),
     "log.jsonl:5: telemetry event: norm_stats[0].layer is a list, not an integer or null"),
    (lambda run: hand_run(run, json.dumps({**headroom(4), "ops": [{**headroom(4)["ops"][0], "op": {"a": 1}}]}).encode()
                          + b"\n"), "log.jsonl:5: headroom event: ops[0].op is an object, not a string"),
    (lambda run: os.makedirs(run / "log.jsonl"), "log.jsonl is a folder"),
    (lambda run: os.makedirs(run) or os.symlink(run / "gone", run / "log.jsonl"), "which does not exist"),
])
def test_a_foreign_log_is_one_line_naming_the_file_and_line(tmp_path, capsys, make, expected):
    make(tmp_path / "run")
    assert plot.main([str(tmp_path / "run"), f"--out={tmp_path / 'png'}"]) == 2
    assert_one_line(capsys, str(tmp_path / "run"), expected)
    assert not os.path.exists(tmp_path / "png")


DAMAGES = {
    "not JSON": (lambda path, _: path.write_bytes(b'{"mode": "lr", "varia'), ": not JSON"),
    "not an object": (lambda path, _: path.write_text("[1, 2]"), ": a list, not an object"),
    "nested too deeply": (lambda path, _: path.write_text("[" * 100_000), ": not JSON"),
    "a key missing": (lambda path, summary: path.write_text(json.dumps(summary)), ": runs[1].status is missing"),
    "a folder": (lambda path, _: path.mkdir(), " is a folder"),
    "a FIFO": (lambda path, _: os.mkfifo(path), " is not a regular file"),
    "a broken symlink": (lambda path, _: path.symlink_to(path.parent / "gone.json"), " is a symlink to /"),
}


@pytest.mark.parametrize("place", ["sweep folder", "--experiments"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_summary_is_one_line_naming_it(tmp_path, capsys, place, damage):
    summary = {**recipe_summary(), "mode": "lr", "variants": [{"variant": "baseline", "init_loss": 5.5}]}
    del summary["runs"][1]["status"]  # read by plot_loss_vs_lr (an --mode=lr sweep) and by the results page
    make, expected = DAMAGES[damage]
    if place == "sweep folder":
        hand_run(tmp_path / "sweep" / "baseline" / "0.5" / "0")
        args = [str(tmp_path / "sweep")]
    else:
        os.makedirs(tmp_path / "sweep" / "tiny")
        args = [f"--experiments={tmp_path / 'sweep'}"]
    path = tmp_path / "sweep" / ("summary.json" if place == "sweep folder" else "tiny/summary.json")
    make(path, summary)
    assert plot.main([*args, f"--out={tmp_path / 'png'}"]) == 2
    assert_one_line(capsys, f"plot.py: {path}{expected}", "the summary.json that sweep.py writes")
    assert not os.path.exists(tmp_path / "png")


@pytest.mark.parametrize("out, expected", [
    (lambda tmp: "", "--out is empty"),
    (lambda tmp: str(tmp / "mine.txt"), "mine.txt is a file"),
    (lambda tmp: str(tmp / "mine.txt" / "png"), "png is under /"),
])
def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, out, expected):
    run = hand_run(tmp_path / "run")
    (tmp_path / "mine.txt").write_text("kept\n")
    assert plot.main([str(run), f"--out={out(tmp_path)}"]) == 2
    assert_one_line(capsys, expected, "is made if absent")
    assert sorted(os.listdir(tmp_path)) == ["mine.txt", "run"] and (tmp_path / "mine.txt").read_text() == "kept\n"


@pytest.mark.parametrize("place, code", [("runs", errno.ENOSPC), ("runs", errno.EROFS),
                                         ("--experiments", errno.ENOSPC)])
def test_a_failed_write_is_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch, place, code):
    if place == "runs":
        args, first = [str(hand_run(tmp_path / "run"))], tmp_path / "out" / "loss.png"
    else:
        write_json(tmp_path / "sweeps" / "tiny" / "summary.json", recipe_summary())
        args = [f"--experiments={tmp_path / 'sweeps'}"]
        first = tmp_path / "out" / "experiments" / "records" / "tiny.json"

    def fail(fd):  # by now the picture's bytes are in the temporary file beside it
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    assert plot.main([*args, f"--out={tmp_path / 'out'}"]) == 1
    assert capsys.readouterr().err == f"plot.py: cannot write {first} ({os.strerror(code)})\n"
    assert os.listdir(first.parent) == []
    assert sorted(os.listdir(tmp_path / "out")) == (["experiments"] if place == "--experiments" else [])


def test_the_op_that_grew_most_is_named_where_none_went_over_float16(tmp_path):
    summary = recipe_summary()
    summary["variants"][0].update(grew_most="q@k layer 0 (x12.3)", grew_most_count=2)  # train.py's newer event
    summary["variants"][1].update(failed_op="fc2 layer 1", failed_op_count=1)  # an older summary: no grew_most
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 0
    page = (tmp_path / "docs" / "experiments.md").read_text()
    assert ("baseline: loss gap in 2 of 2, none over 65504; the op that grew the most: q@k layer 0 (x12.3) in 2; "
            "norm=rmsnorm: loss gap in 2 of 2, first op over the float16 range fc2 layer 1 in 1.") in page
    check_png(tmp_path / "docs" / "experiments" / "tiny.png")


MISSING = object()  # set_path's value that removes the key


def set_path(summary, path, value):
    *keys, last = path
    for key in keys:
        summary = summary[key]
    if value is MISSING:
        del summary[last]
    else:
        summary[last] = value


MALFORMED = {
    "a curve row of 2 numbers": ((["runs", 0, "curve", 1], [20, 0.2]), "runs[0].curve[1] has 2 items, not 3"),
    "a word for an LR": ((["runs", 2, "lr"], "fast"), "runs[2].lr is \"fast\", not a positive number"),
    "a finished run without a final loss": ((["runs", 1, "status"], "done"), "runs[1] is done without a final_loss"),
    "a status sweep.py never writes": ((["runs", 3, "status"], "ok"), "runs[3].status is \"ok\", not one of"),
    "an L(lr) column at no LR": ((["variants", 0, "L(fast)"], 3.0), "variants[0].L(fast) is not L(an LR)"),
    "an L(lr) past a float's range": ((["variants", 0, "L(0.5)"], 10 ** 400), "not JSON"),
    # a summary that names a recipe and lacks its claims was a KeyError in the sweep folder's plots
    "a recipe's summary without its claims": ((["claims"], MISSING), "claims is missing"),
}


# a sweep folder's plots do not read the curves: a damaged curve is the results page's (--experiments) alone
@pytest.mark.parametrize("place,damage", [(place, damage) for place in ("sweep folder", "--experiments")
                                          for damage in MALFORMED if place == "--experiments" or "curve" not in damage])
def test_a_malformed_summary_is_one_line_before_anything_is_drawn(tmp_path, capsys, place, damage):
    summary = {**recipe_summary(), "mode": "lr"}
    summary["variants"] = [{**row, "init_loss": 5.5, "L(0.5)": math.inf} for row in summary["variants"]]
    summary["runs"][1]["final_loss"] = None  # an unfinished run has none
    (path, value), expected = MALFORMED[damage]
    set_path(summary, path, value)
    if place == "sweep folder":
        hand_run(tmp_path / "sweep" / "baseline" / "0.5" / "0")
        args = [str(tmp_path / "sweep")]
    else:
        args = [f"--experiments={tmp_path / 'sweep'}"]
    write_json(tmp_path / "sweep" / "summary.json", summary)
    assert plot.main([*args, f"--out={tmp_path / 'png'}"]) == 2
    assert_one_line(capsys, f"plot.py: {tmp_path / 'sweep' / 'summary.json'}: {expected}")
    assert not os.path.exists(tmp_path / "png")


# issue 46: values a summary's shape allows and its meaning does not; each was a traceback (IndexError, KeyError,
# TypeError, ValueError) after docs/ was made, or text on the page (a heading, "n pairs -3")
MEANINGLESS = {
    "no claim for a metric figure": (lambda s: s["recipe"].update(figure="metric", claims=[]),
                                     "recipe.claims is empty, and its figure (metric) plots its first claim's metric"),
    "a metric no recipe has": (lambda s: s["claims"][0].update(metric="bogus@1.0"),
                               'claims[0].metric is "bogus@1.0": no metric of lab/recipes.py'),
    "a metric at no LR": (lambda s: s["recipe"]["claims"][0].update(metric="steps_survived@fast"),
                          'recipe.claims[0].metric is "steps_survived@fast": "fast" is not an LR'),
    "no seeds": (lambda s: s["recipe"]["design"].update(seeds=[]), "recipe.design.seeds is empty"),
    "an interval of words": (lambda s: s["claims"][0].update(effect_ci=["a", "b"]),
                             "claims[0].effect_ci[0] is a string, not a number"),
    "an interval upside down": (lambda s: s["claims"][0].update(effect_ci=[0.5, -0.5]),
                                "claims[0].effect_ci is [0.5, -0.5], not an interval [low, high]"),
    "a diverged ramp run without its LR": (lambda s: s["runs"][0].update(peak_lr=None),
                                           "runs[0] diverged in a ramp without its peak_lr"),
    "a heading in the title": (lambda s: s["recipe"].update(title="a tiny ramp\n# Injected"),
                               'recipe.title is "a tiny ramp\\n# Injected", not one line of printable text'),
    "a negative count of pairs": (lambda s: s["claims"][0].update(n=-3),
                                  "claims[0].n is -3, not a number of pairs >= 0"),
    "a p-value past 1": (lambda s: s["claims"][0].update(p_holm=1.5), "claims[0].p_holm is 1.5, not a probability"),
}


@pytest.mark.parametrize("damage", list(MEANINGLESS))
def test_a_summary_whose_values_mean_nothing_is_one_line_before_anything_is_written(tmp_path, capsys, damage):
    summary = recipe_summary()
    edit, expected = MEANINGLESS[damage]
    edit(summary)
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 2
    assert_one_line(capsys, f"plot.py: {tmp_path / 'sweeps' / 'tiny' / 'summary.json'}: {expected}",
                    "move it away and run the sweep's command again to rebuild it from the runs' logs")
    assert not os.path.exists(tmp_path / "docs")


def test_a_summary_with_fields_beyond_the_readers_is_read():
    """The checks hold the fields the readers read and leave any other (a newer sweep.py's) alone."""
    summary = recipe_summary()
    summary.update(design_hash="abc", pilot={"seeds": [10]}, per_seed=[[1, 2]])
    summary["recipe"]["design"]["pilot"] = {"n": 2}
    summary["claims"][0]["per_seed"] = {"0": 1.0}
    assert schema.check_values("summary.json", summary) is None


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ""])
def test_a_recipe_name_that_is_not_a_plain_name_is_refused(tmp_path, capsys, name):
    """The results page names a recipe's figure after it: ../../x would write outside --out."""
    summary = recipe_summary()
    summary["recipe"]["name"] = name
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'out' / 'docs'}"]) == 2
    assert_one_line(capsys, "recipe.name", "not a plain name")
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "x")


def page_of(tmp_path, summary):
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 0
    return (tmp_path / "docs" / "experiments.md").read_text()


def test_the_page_refuses_a_stored_verdict_its_numbers_contradict(tmp_path, capsys):
    """"agrees" beside p (Holm) 0.125 is refused with one line; the same summary with its own verdict is shown."""
    summary = recipe_summary()
    [claim] = summary["claims"]
    assert claim["p_holm"] >= 0.05 and not claim["verdict"].startswith("agrees")
    page_of(tmp_path, summary)
    claim["verdict"] = "agrees"
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 2
    assert_one_line(capsys, "claims[0] says 'agrees'", "its numbers give 'not detected")


def test_the_page_shows_a_withheld_verdict_only_with_its_reason(tmp_path, capsys):
    """A recipe whose runs did not all run has no verdict, and its summary says why (no_verdict): the page shows
    that, and refuses a verdict stored beside such a reason."""
    summary = recipe_summary()
    [claim] = summary["claims"]
    summary["no_verdict"] = "1 of 4 runs failed: they crashed or were refused, see their .out files"
    claim["verdict"] = f"no verdict ({summary['no_verdict']})"
    assert claim["verdict"] in page_of(tmp_path, summary)
    claim["verdict"] = claims_verdict = "not detected (observed minimum detectable effect 0.1)"
    write_json(tmp_path / "sweeps" / "tiny" / "summary.json", summary)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 2
    assert_one_line(capsys, f"claims[0] says {claims_verdict!r}", "its numbers give 'no verdict (1 of 4 runs")


def test_the_page_names_the_recipes_it_has_no_summary_of(tmp_path):
    summary = recipe_summary()
    page = page_of(tmp_path, summary)
    missing = [name for name in recipes.RECIPES if name != summary["recipe"]["name"]]
    assert f"Not yet run under the current design, so without a verdict: {', '.join(missing)} (" in page
    # each with the commands that would run it, pilot first
    assert "## Not yet run" in page and "`python sweep.py --recipe=powernorm --pilot --jobs=2`, then" in page


def test_the_page_never_prints_nan_or_inf_as_a_number(tmp_path):
    summary = recipe_summary()
    summary["wall_s"] = math.nan
    summary["machine"]["load"] = math.inf
    [claim] = summary["claims"]
    claim.update(power=math.nan, sd=math.nan, effect_to_detect=math.nan)
    page = page_of(tmp_path, summary)
    words = set(page.replace("|", " ").replace("(", " ").replace(",", " ").lower().split())
    assert not words & {"nan", "inf", "-inf", "+nan", "+inf", "nan%", "infinity"}, page
    assert "It took an unknown time" in page and "load average unknown" in page


def test_the_page_prints_the_flags_the_runs_had(tmp_path):
    """Extra flags after the recipe's show in the command, with a word that the deviations are the recipe's; a
    variant's own flags are listed as its own, not the shared flag it overrides as every run's."""
    summary = recipe_summary()
    summary["recipe"]["variants"] = ["baseline+n_layer=6", "norm=rmsnorm+n_layer=18"]
    summary["recipe"]["train_argv"] = ["--max_iters=50", "--n_layer=4", "--n_embd=32"]
    summary["recipe"]["recipe_argv"] = ["--max_iters=50", "--n_layer=4"]
    page = page_of(tmp_path, summary)
    assert "Command: `python sweep.py --recipe=tiny --n_embd=32`" in page
    assert "flags beyond the recipe's (`--n_embd=32`)" in page and "do not describe them" in page
    assert "Every run's flags: `--max_iters=50 --n_embd=32`" in page and "--n_layer=4" not in page
    assert "baseline+n_layer=6: `--preset=baseline --n_layer=6`" in page
    assert "norm=rmsnorm+n_layer=18: `--norm=rmsnorm --n_layer=18`" in page


def test_a_summary_of_another_design_is_marked_as_such(tmp_path):
    """The test's recipe "tiny" is not in lab/recipes.py: its section and headline say they are an earlier
    design's; every claim's failure rule, test, interval coverage and target unit are on the page."""
    page = page_of(tmp_path, recipe_summary())
    assert "**From an earlier design.**" in page and "| earlier design: not detected" in page
    assert "- Failure rule:" in page and "- Test, for every claim:" in page and "interval's coverage" in page
    assert "steps (the paper's)" in page


def test_a_gradient_ratio_figure_without_ratios_is_drawn_not_a_traceback(tmp_path):
    """`sweep.py --recipe=normformer_loss --n_layer=1`: a 1-layer model has no layer beside layer 0, so no run has
    a ratio; the log axis has nothing to scale and the page is written all the same."""
    summary = recipe_summary()
    for run in summary["runs"]:
        run.update(fc2_grad_ratio=None, fc2_ratio_curve=[], status="done", diverged=False, final_loss=2.0,
                   final_loss_capped=2.0)
    claim = recipes.Claim("norm=rmsnorm", "fc2_grad_ratio@0.5", "better", "Fig. 3", effect=0.25,
                          effect_source="a quarter", target_origin="nanonorm", relative=True)
    summary["recipe"].update(figure="grad_ratio", claims=[vars(claim)])
    summary["claims"] = lab.claims.judge(summary["runs"], [claim], "baseline", ["0.5"])
    page = page_of(tmp_path, summary)
    assert "not run yet" in page
    check_png(tmp_path / "docs" / "experiments" / "tiny.png")


def test_the_readme_links_the_results_pages_headline_and_copies_no_claim():
    """The claims live on the generated page alone: the README links its headline table, which the page has, and
    holds no table of claims or verdicts that could drift from it."""
    page = open(os.path.join(ROOT, "docs", "experiments.md"), encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert "## Headline" in page and "](docs/experiments.md#headline)" in readme
    assert not any(line.startswith("| recipe |") or line.startswith("| [") for line in readme.splitlines())


def test_the_readme_is_a_users_entry():
    """At most 150 lines, none past 120 columns outside its code blocks."""
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    assert len(lines) <= 150
    fences = [i for i, line in enumerate(lines) if line.startswith("```")]
    inside = {i for start, end in zip(fences[::2], fences[1::2]) for i in range(start, end + 1)}
    assert all(len(line) <= 120 for i, line in enumerate(lines) if i not in inside)


def test_a_legend_is_drawn_only_for_what_has_a_label(recwarn):
    fig, ax = plt.subplots()
    figures.legend_outside(ax)  # nothing drawn: matplotlib would warn that no artist has a label
    assert ax.get_legend() is None
    ax.plot([1, 2], [3, 4], label="baseline")
    figures.legend_outside(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["baseline"]
    plt.close(fig)
    assert not [w for w in recwarn if "legend" in str(w.message)]


def test_the_committed_page_regenerates_from_its_committed_data_byte_for_byte(tmp_path):
    # what CI checks: docs/experiments.md and its data are what `python plot.py
    # --experiments=docs/experiments/records --out=docs` gives in a clean clone, which has no sweeps/
    data = os.path.join(ROOT, "docs", "experiments", "records")
    assert plot.main([f"--experiments={data}", f"--out={tmp_path}"]) == 0
    with open(os.path.join(ROOT, "docs", "experiments.md"), "rb") as f:
        assert (tmp_path / "experiments.md").read_bytes() == f.read()
    for name in sorted(os.listdir(data)):
        if name.endswith(".json"):
            with open(os.path.join(data, name), "rb") as f:
                assert (tmp_path / "experiments" / "records" / name).read_bytes() == f.read(), name


COMMITTED = os.path.join(ROOT, "docs", "experiments", "records")

# issue 55: records the page trusted; each published a page (exit 0). An edit to the committed data of normformer_lr.
EDITED_RECORDS = {
    "another recipe's name": (lambda s: s["recipe"].update(name="normformer_loss"), "normformer_loss.json",
                              "recipe.design_sha256 is 3a5ba9a32c22..., not the hash of the design its recipe holds"),
    "another recipe's name, its own file": (lambda s: s["recipe"].update(name="normformer_loss"), None,
                                            "recipe.design_sha256 is 3a5ba9a32c22..., not the hash of the design"),
    "no judged claims": (lambda s: s.update(claims=[]), None,
                         "claims holds 0 judged claims, and recipe.claims declares 1"),
    "a judged claim of another variant": (lambda s: s["claims"][0].update(variant="baseline"), None,
                                          'claims[0].variant is "baseline", where recipe.claims[0], the claim it '
                                          'judges, has "nf_normformer"'),
    "HTML in the quote": (lambda s: s["recipe"].update(quote="<script>alert(1)</script>"), None,
                          "recipe.design_sha256 is 3a5ba9a32c22..., not the hash of the design its recipe holds"),
    "a list as paper_number": (lambda s: s["claims"][0].update(paper_number=["a", "b"]), None,
                               "claims[0].paper_number is a list, not a string"),
    "a mode sweep.py has not": (lambda s: s.update(mode="bogus"), None, 'mode is "bogus", not one of lr, ramp'),
    "a design hash of zeros": (lambda s: s["recipe"].update(design_sha256="0" * 64), None,
                               "recipe.design_sha256 is 000000000000..., not the hash of the design its recipe holds"),
    "an earlier design sweep.py never recorded": (
        lambda s: s["recipe"].update(seed_list=[1, 2], design_sha256=schema.recorded_design_hash(
            {**s["recipe"], "seed_list": [1, 2]})), None,
        "neither the design lab/recipes.py holds now nor one sweep.py recorded before the runs (design_record)"),
    "a design record without its time": (lambda s: s["design_record"][0].pop("recorded"), None,
                                         "design_record[0].recorded is missing"),
    "page data under another recipe's file name": (lambda s: None, "normformer_loss.json",
                                                   "recipe.name is normformer_lr (cpu scale), whose page data is "
                                                   "normformer_lr.json"),
}


@pytest.mark.parametrize("damage", list(EDITED_RECORDS))
def test_a_record_is_held_to_what_its_recipe_declares(tmp_path, capsys, damage):
    edit, file_name, expected = EDITED_RECORDS[damage]
    data = tmp_path / "records"
    data.mkdir()
    for name in os.listdir(COMMITTED):
        if name.endswith(".json") and name not in ("normformer_lr.json", file_name):
            shutil.copy(os.path.join(COMMITTED, name), data / name)
    with open(os.path.join(COMMITTED, "normformer_lr.json")) as f:
        record = json.load(f)
    edit(record)
    path = data / (file_name or "normformer_lr.json")
    write_json(path, record)
    assert plot.main([f"--experiments={data}", f"--out={tmp_path / 'docs'}"]) == 2
    assert_one_line(capsys, f"plot.py: {path}: ", expected)
    assert not os.path.exists(tmp_path / "docs")


def test_a_record_of_an_earlier_design_sweep_py_recorded_is_shown_as_such(tmp_path):
    """The design hash names the design the record holds and sweep.py recorded before its runs: a design
    lab/recipes.py has since changed is published, marked as an earlier one."""
    data = tmp_path / "records"
    data.mkdir()
    with open(os.path.join(COMMITTED, "normformer_lr.json")) as f:
        record = json.load(f)
    record["recipe"]["seed_list"] = [1, 2]
    record["recipe"]["design_sha256"] = schema.recorded_design_hash(record["recipe"])
    record["design_record"].append({**record["design_record"][-1], "sha256": record["recipe"]["design_sha256"]})
    write_json(data / "normformer_lr.json", record)
    assert plot.main([f"--experiments={data}", f"--out={tmp_path / 'docs'}"]) == 0
    page = (tmp_path / "docs" / "experiments.md").read_text()
    assert "**From an earlier design.** These runs' seeds differ from lab/recipes.py" in page


def test_two_summaries_of_one_recipe_at_two_places_on_the_page_are_refused(tmp_path, capsys):
    """Two sections under one anchor: the same recipe and scale with another recipe.order."""
    write_json(tmp_path / "sweeps" / "a" / "summary.json", recipe_summary())
    moved = recipe_summary()
    moved["recipe"]["order"] = 5
    write_json(tmp_path / "sweeps" / "b" / "summary.json", moved)
    assert plot.main([f"--experiments={tmp_path / 'sweeps'}", f"--out={tmp_path / 'docs'}"]) == 2
    assert_one_line(capsys, f"plot.py: {tmp_path / 'sweeps' / 'b' / 'summary.json'}: its recipe and scale are those of "
                    f"{tmp_path / 'sweeps' / 'a' / 'summary.json'}, at another place on the page")
    assert not os.path.exists(tmp_path / "docs")


def test_the_page_escapes_the_html_a_summary_holds(tmp_path):
    """Markdown passes HTML through: a summary's text is printed as text (the page writes its own anchors), and the
    command and flags, in code spans, as they are."""
    summary = recipe_summary()
    summary["recipe"].update(quote="<script>alert(1)</script>", title="a & b", deviations="x <b>bold</b>",
                             train_argv=["--max_iters=50", "--note=<i>"], command="python sweep.py --recipe=tiny <x>")
    summary["claims"][0]["paper_number"] = "94 < 200 steps"
    summary["recipe"]["claims"][0]["paper_number"] = "94 < 200 steps"
    summary["machine"]["hardware"] = "<img src=x>"
    page = page_of(tmp_path, summary)
    assert "> &lt;script&gt;alert(1)&lt;/script&gt;\n" in page and "<script>" not in page
    assert "## a &amp; b\n" in page and "x &lt;b&gt;bold&lt;/b&gt;" in page and "| 94 &lt; 200 steps |" in page
    assert "on &lt;img src=x&gt; " in page and "<img" not in page and "<b>" not in page
    assert "`python sweep.py --recipe=tiny <x> --note=<i>`" in page
    assert re.findall(r"<[a-z]", re.sub(r"`[^`]*`", "", page)) == ["<a"] * page.count('<a id="')  # its anchors
    # the data keeps the summary's own text: the page regenerates from it byte for byte
    data = tmp_path / "docs" / "experiments" / "records"
    assert json.loads((data / "tiny.json").read_text())["recipe"]["quote"] == "<script>alert(1)</script>"
    assert plot.main([f"--experiments={data}", f"--out={tmp_path / 'again'}"]) == 0
    assert (tmp_path / "again" / "experiments.md").read_text() == page


def test_a_page_from_sweeps_and_the_page_from_its_written_data_are_one_page(tmp_path):
    summary = recipe_summary()
    summary["runs"][0]["logit_curve"] = [[10, 1.0, 0.5]]  # a curve no figure draws: left out of the data
    page = page_of(tmp_path, summary)
    data = tmp_path / "docs" / "experiments" / "records"
    assert json.loads((data / "tiny.json").read_text())["runs"][0]["logit_curve"] == []
    assert plot.main([f"--experiments={data}", f"--out={tmp_path / 'again'}"]) == 0
    assert (tmp_path / "again" / "experiments.md").read_text() == page
    again = tmp_path / "again" / "experiments" / "records" / "tiny.json"
    assert again.read_bytes() == (data / "tiny.json").read_bytes()
    # the page links the claim's data and prints its per-seed differences (here +5 and +5 steps)
    assert "(seed: d) 0: +5, 1: +5; in [experiments/records/tiny.json](experiments/records/tiny.json)" in page


def test_the_pages_recipe_for_recomputing_p_and_the_interval_with_scipy_gives_the_claims_numbers(tmp_path):
    # 8 pairs, differences of a lower-is-better loss, 2 tested claims (alpha 0.025 at Holm's first step)
    diffs = [-0.031, -0.012, 0.004, -0.027, -0.018, -0.009, -0.022, 0.006]
    runs = [{"variant": v, "lr": "0.5", "seed": s, "status": "done", "diverged": False, "init_loss": 5.5,
             "final_loss": 2.0 + (d if v == "v" else 0), "final_loss_capped": 2.0 + (d if v == "v" else 0),
             "failure_loss": 5.5} for v in ("ref", "v") for s, d in enumerate(diffs)]
    claims = [recipes.Claim("v", "final_loss@0.5", "better", "", 0.01, "", "paper"),
              recipes.Claim("v", "final_loss@0.5", "worse", "", 0.01, "", "paper")]
    claim = lab.claims.judge(runs, claims, "ref", ["0.5"])[0]
    (tmp_path / "docs" / "experiments" / "records").mkdir(parents=True)
    (tmp_path / "docs" / "experiments" / "records" / "RECIPE.json").write_text(json.dumps({"claims": [claim]}))
    code = lab.results_page.RECOMPUTE.split("```python\n")[1].split("```")[0]
    printed = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        with contextlib.redirect_stdout(printed):
            exec(code, {})
    finally:
        os.chdir(cwd)
    text = printed.getvalue().replace("np.float64", "")
    p, low, high, coverage = map(float, re.findall(r"-?[0-9]+\.?[0-9]*(?:e-?[0-9]+)?", text))
    interval = [low, high]
    assert p == pytest.approx(claim["p"], rel=1e-9) and interval == pytest.approx(claim["effect_ci"], rel=1e-9)
    assert coverage == pytest.approx(claim["ci_coverage"]) and claim["ci_coverage"] == 1 - 2 * 3 / 256


@pytest.mark.parametrize("call, expected", [
    # independent of lab/tables.py: written by hand from the numbers
    (lambda t: t.value_text(2.0361234), "2.036"),  # 4 significant digits
    (lambda t: t.value_text(0.00123456), "0.001235"),
    (lambda t: t.interval_text(0.0213456, [-0.0041234, 0.0356789]), "+0.0213 [-0.00412, +0.0357]"),
    (lambda t: t.interval_text(-1.5, [-2.25, 0.0]), "-1.5 [-2.25, +0]"),  # low end first, the "+" kept
    (lambda t: t.coverage_text(1 - 2 / 64), "96.9%"),  # one decimal: 97% would hide 96.9 < 97
    (lambda t: t.coverage_text(1 - 12 / 256), "95.3%"),
    (lambda t: t.p_value_text(2 / 64), "0.0312"),
    (lambda t: t.power_text(0.804), "80%"),
    (lambda t: t.mde_text(math.inf), "none reachable")])
def test_the_pages_number_formats_are_the_ones_written_here(call, expected):
    assert call(lab.tables) == expected


def test_a_claims_headline_row_is_the_one_written_here(tmp_path):
    summary = recipe_summary()
    [claim] = summary["claims"]
    claim.update(effect=12.3456, effect_ci=[-3.21098, 27.891], ci_coverage=1 - 12 / 256, p_holm=0.0703125,
                 power=0.4567, verdict="not detected (observed minimum detectable effect 41.2)", mde=41.2,
                 reading="not detected", effect_to_detect=13.125)
    page = page_of(tmp_path, summary)
    assert ("| [tiny](#tiny) | norm=rmsnorm vs baseline, expected better: steps survived, LR ramp to 0.5 | "
            "+12.3 [-3.21, +27.9] | 95.3% | 0.0703 | 13.12 steps (the paper's) | 46% | earlier design: not detected "
            "(observed minimum detectable effect 41.2) |") in page


def chaotic_summary(gains, threads):
    """recipe_summary() on 8 seeds, marked chaotic: the variant survives gains[seed] steps more than the reference."""
    summary = recipe_summary()
    run = summary["runs"][0]
    summary["runs"] = [{**run, "variant": variant, "seed": seed,
                        "steps_survived": 100 + (gain if variant == "norm=rmsnorm" else 0)}
                       for seed, gain in enumerate(gains) for variant in ("baseline", "norm=rmsnorm")]
    claim = recipes.Claim(**summary["recipe"]["claims"][0])
    summary["claims"] = lab.claims.judge(summary["runs"], [claim], "baseline", ["0.5"])
    summary["recipe"]["chaotic"] = True
    summary["threads"] = threads
    return summary


def test_a_chaotic_recipes_verdict_is_unstable_where_another_thread_count_reads_it_otherwise(tmp_path):
    first = chaotic_summary([30, 40, 35, 50, 45, 30, 60, 40], threads=1)  # all 8 better: agrees
    write_json(tmp_path / "sweeps" / "tiny_threads2" / "summary.json",
               chaotic_summary([30, -40, 35, -50, 45, -30, 60, -40], threads=2))  # mixed: not detected
    page = page_of(tmp_path, first)
    assert first["claims"][0]["reading"] == "agrees"
    assert ("| earlier design: unstable across machines (2-core CPU, 1 thread a run: agrees; 2-core CPU, 2 threads a "
            "run: not detected) |") in page
    assert ("| 2-core CPU, 2 threads a run | norm=rmsnorm vs baseline, expected better: steps survived, LR ramp to "
            "0.5 | +1.25 [-40, +45] |") in page
    # per seed d moved 0, 80, 0, 100, 0, 60, 0, 80: the spread one machine's number carries
    assert "2-core CPU, 2 threads a run: the per-seed d moved by up to 100 (median 30) over the 8 seeds both" in page
    assert (tmp_path / "docs" / "experiments" / "records" / "tiny.replicate1.json").exists()
    # one run set alone: the verdict says its spread was not measured
    os.remove(tmp_path / "sweeps" / "tiny_threads2" / "summary.json")
    page = page_of(tmp_path, first)
    assert "| earlier design: agrees (one machine and thread count only: the spread across them not measured) |" in page


def test_a_replicate_of_a_recipe_not_marked_chaotic_shows_its_spread_descriptive_rows_too(tmp_path):
    # spike counts are as chaotic as a divergence step: any recipe run on a second thread count shows the spread
    first = chaotic_summary([30, 40, 35, 50, 45, 30, 60, 40], threads=1)
    first["recipe"]["chaotic"] = False
    second = chaotic_summary([30, -40, 35, -50, 45, -30, 60, -40], threads=2)
    second["recipe"]["chaotic"] = False
    write_json(tmp_path / "sweeps" / "tiny_threads2" / "summary.json", second)
    assert "unstable across machines (2-core CPU, 1 thread a run: agrees; 2-core CPU, 2 threads a run: not" in page_of(
        tmp_path, first)
    for summary in (first, second):
        summary["claims"][0].update(tested=False, verdict="descriptive", reading="descriptive", p_holm=None)
        summary["recipe"]["claims"][0]["tested"] = False  # the recipe declares it so (lab/schema holds them together)
    page = page_of(tmp_path, first)
    assert "| unstable across machines" not in page and "earlier design: descriptive |" in page
    assert "| 2-core CPU, 2 threads a run | norm=rmsnorm vs baseline, expected better: steps survived" in page
    # run once and not chaotic: no spread section at all
    os.remove(tmp_path / "sweeps" / "tiny_threads2" / "summary.json")
    assert "Spread across machines" not in page_of(tmp_path, first)


def test_a_pilot_alone_is_not_a_result(tmp_path):
    # sweep.py --recipe=NAME --pilot: the pilot seeds test nothing, so the page still names the recipe as not run
    summary = recipe_summary()
    summary["stage"] = "pilot"
    page = page_of(tmp_path, summary)
    assert '<a id="tiny"></a>' not in page and "| [tiny]" not in page


def test_a_row_against_the_papers_direction_is_called_out_descriptive_ones_too(tmp_path):
    summary = chaotic_summary([-30, -40, -35, -50, -45, -30, -60, -40], threads=1)  # worse on all 8 seeds
    summary["recipe"]["chaotic"] = False
    [claim] = summary["claims"]
    assert claim["reading"] == "disagrees"
    page = page_of(tmp_path, summary)
    assert "**Against the paper's direction** (a tested claim): its own p is 0.00781, the mean d -41.25" in page
    claim.update(tested=False, verdict="descriptive", reading="descriptive", p_holm=None)
    summary["recipe"]["claims"][0]["tested"] = False
    page = page_of(tmp_path, summary)
    assert "**Against the paper's direction** (a row outside Holm's family, all the same)" in page
    # against the paper but not significant: a descriptive row, which has no verdict, still says where it points
    summary = chaotic_summary([-30, -40, -35, 50, -45, -30, -60, -40], threads=1)
    summary["recipe"]["chaotic"] = False
    [claim] = summary["claims"]
    assert claim["p"] >= 0.05 and claim["effect"] < 0
    claim.update(tested=False, verdict="descriptive", reading="descriptive", p_holm=None)
    summary["recipe"]["claims"][0]["tested"] = False
    page = page_of(tmp_path, summary)
    assert ("Its estimate points against the paper's direction (mean d -28.75 in the paper's sign, its own p "
            f"{lab.tables.p_value_text(claim['p'])}): not significant at this scale") in page
    assert "**Against the paper's direction**" not in page
    # a control: the paper predicts no effect, so there is no direction to go against
    claim.update(control=True, verdict="control (outside the family: the paper predicts no gap here)")
    summary["recipe"]["claims"][0]["control"] = True
    assert "points against the paper's direction" not in page_of(tmp_path, summary)


def test_an_a_priori_power_below_80_percent_says_the_scale_cannot_decide_the_claim(tmp_path):
    summary = chaotic_summary([30, -40, 35, -50, 45, -30, 60, -40], threads=1)
    [claim] = summary["claims"]
    assert claim["reading"] == "not detected"
    claim.update(pilot_seeds=[100, 101, 102], pilot_differences=[128, -17, -37], pilot_sd=90.0, power=0.64,
                 planned_pairs=16, pairs_for_power=None)
    page = page_of(tmp_path, summary)
    assert ("A-priori power 64% for the target with 16 planned pairs, from the pilot's sd 90 (pilot seeds, never "
            "tested: 100: +128, 101: -17, 102: -37); 80% power would take more than 16 pairs. Below 80%: at this "
            "scale the design could not be planned to decide the claim") in page
    # with the pilot sd's upper bound recorded, the power is the bound's and the estimate's stands beside it
    claim.update(pilot_sd_bound=190.6, power_at_estimate=0.64, power=0.2)
    assert ("A-priori power 20% for the target with 16 planned pairs, at the pilot sd's 80% upper bound 190.6 (64% at "
            "the estimate 90, which 3 seeds cannot carry)") in page_of(tmp_path, summary)
    claim.update(pilot_sd_bound=None, power_at_estimate=None, power=0.64)
    assert "`python sweep.py --recipe=tiny --scale=gpu`" in page
    claim.update(power=0.81, pairs_for_power=15)
    assert "Below 80%" not in page_of(tmp_path, summary)
    # detected all the same (powernorm: 39% power, p 9e-5): not "says little", but the winner's curse
    summary = chaotic_summary([30, 40, 35, 50, 45, 30, 60, 40], threads=1)
    [claim] = summary["claims"]
    assert claim["reading"] == "agrees"
    claim.update(pilot_seeds=[100, 101, 102], pilot_differences=[128, -17, -37], pilot_sd=90.0, power=0.39,
                 planned_pairs=16, pairs_for_power=None, power_tested=0.3)
    page = page_of(tmp_path, summary)
    assert "Below 80% for the target, yet the effect was large enough to detect" in page
    assert "here says little" not in page
    # no winner's curse where the tested pairs' own spread gave the design its power after all
    claim.update(power_tested=0.9)
    page = page_of(tmp_path, summary)
    assert "Below 80% as planned, but the tested pairs' own spread gave 90% power" in page
    assert "winner's curse" not in page


@pytest.mark.parametrize("log_z, says", [
    (5.369, "median 5.369 over its seeds, at least 1 from 0: the drift z-loss is meant to prevent was there"),
    (-1.5, "median -1.5 over its seeds, at least 1 from 0: the drift"),
    (0.2, "median 0.2 over its seeds, within 1 of 0: nothing for z-loss to fix, so a \"not detected\" above says "
          "little")])
def test_the_baselines_log_z_says_whether_there_was_a_drift_to_fix(log_z, says):
    # z_loss_lr's mechanism row: the baseline's |mean log Z| ended at 5.37, yet the page said "near 0: nothing for
    # z-loss to fix"
    summary = recipe_summary()
    [claim] = summary["claims"]
    claim.update(metric="log_z@1e-1", effect_to_detect=1.0, arm_medians={"baseline": log_z, "norm=rmsnorm": 0.1})
    [text, _] = lab.results_page.claim_lines(summary, "data.json")
    assert f"The baseline's |mean log Z| at the end: {says}" in text


def test_a_control_that_shows_a_gap_says_so():
    # deepnorm_depth's 6-layer control: the paper predicts no gap, the runs gave DeepNorm +0.109 [+0.075, +0.151]
    summary = chaotic_summary([30, 40, 35, 50, 45, 30, 60, 40], threads=1)
    [claim] = summary["claims"]
    claim.update(tested=False, control=True, verdict="control (outside the family: the paper predicts no gap here)",
                 reading="control", p_holm=None)
    [text, _] = lab.results_page.claim_lines(summary, "data.json")
    assert ("**A gap where the paper predicts none** (a control, outside Holm's family): mean d +41.25 in the claim's "
            "sign, its interval +41.2 [") in text and "excludes 0, its own p 0.00781" in text
    claim.update(effect_ci=[-3.0, 50.0])
    [text, _] = lab.results_page.claim_lines(summary, "data.json")
    assert "No gap detected, as the paper predicts (a control): the interval +41.2 [-3, +50] includes 0." in text


def test_the_per_lr_table_counts_the_seeds_behind_each_median_where_they_differ():
    # deepnorm_depth's tested seeds ran only each arm's chosen LR: 3 pilot seeds at the other LRs, 10 at the chosen
    def run(lr, seed, loss):
        return {"variant": "a", "lr": lr, "seed": seed, "status": "done", "final_loss_capped": loss}
    summary = {"recipe": {"lrs": ["1e-3", "2e-3"], "variants": ["a"]}, "claims": [],
               "runs": [run("1e-3", s, 3.0 + s) for s in range(3)] + [run("2e-3", s, 2.0 + s) for s in range(5)]}
    lines = lab.results_page.lr_curve_table(summary)
    assert "(in parentheses: the seeds behind each median" in lines[0]
    assert "| a | 4 (3) | 4 (5) | 0 of 8 | n/a |" in lines
    summary["runs"] = summary["runs"][:3] + summary["runs"][3:6]  # 3 and 3: no counts
    lines = lab.results_page.lr_curve_table(summary)
    assert "| a | 4 | 3 | 0 of 6 | n/a |" in lines and "parentheses" not in lines[0]

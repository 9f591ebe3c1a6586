"""sweep.py: the summaries' arithmetic by hand, --dry_run through train.py's parser, skip and resume for real."""

import dataclasses
import errno
import fcntl
import json
import math
import os
import shlex
import shutil
import signal
from pathlib import Path
import statistics
import subprocess
import sys
import threading
import time
import typing

import pytest

from engine import run_folder
from engine import run_reader
from engine.flags import UsageError as flags_error
from engine import files
import data
import lab.claims
import lab.recipes
from lab import recipes
import lab.stats
import lab.runs
import lab.summary
import sweep
import configs
import train
from conftest import FailingWrites, ROOT, SWEEP_TINY, TINY, last_of_each, prepared, train_argv, without

HAS_RAMP = "ramp" in typing.get_args(configs.TrainConfig.__annotations__["lr_schedule"])
LN_V = math.log(256)  # the failure loss of the byte tokenizer (lab/claims.FAILURE_RULE)


def test_lr_sensitivity_by_hand():
    # F = ln 256 = 5.545 in the place of L_0; L* = 2.5; min(L, F): 3.0, 2.5, F (7.0 capped), F (diverged, inf)
    expected = ((3.0 - 2.5) + 0.0 + (LN_V - 2.5) + (LN_V - 2.5)) / 4
    assert lab.claims.lr_sensitivity([3.0, 2.5, 7.0, math.inf], LN_V) == pytest.approx(expected, abs=1e-15)
    # no LR below F, so no L* to measure from: F, the largest any grid can have (as the claims' seeds count it)
    assert lab.claims.lr_sensitivity([math.inf, math.inf], LN_V) == LN_V
    assert lab.claims.lr_sensitivity([6.0, math.inf], LN_V) == LN_V
    assert lab.claims.lr_sensitivity([2.0, 3.0], None) is None


def test_median_summary_and_most_frequent():
    assert lab.summary.median_summary([5, 1, 10, 3]) == {"median": 4.0, "min": 1, "max": 10}
    assert lab.summary.median_summary([7, 2, 9]) == {"median": 7, "min": 2, "max": 9}
    assert lab.summary.most_frequent(["fc2 layer 1", "q@k layer 0", "q@k layer 0"]) == ("q@k layer 0", 2)
    assert lab.summary.most_frequent([]) == (None, 0)


def write_log(run_dir, events):
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def diverged(step, lr, op, layer):
    return {"event": "diverged", "step": step, "steps_survived": step, "lr": lr, "reason": "loss bound",
            "loss_tail": [9.0], "failed_op": {"op": op, "layer": layer, "pass": "forward", "max_abs": 7e4,
                                              "module": "m"}, "note": ""}


def test_ramp_summary_from_logs(tmp_path):
    """Four seeds: three diverge (fc2 layer 1 twice), one survives the whole ramp; one spike."""
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    logs = {0: [start, diverged(120, 0.06, "q@k", 0)],
            1: [start, {"event": "spike", "step": 30, "loss": 4.0, "grad_norm": 9.0, "z_loss_score": 6.0,
                        "z_grad_score": 7.0, "skipped": False}, diverged(80, 0.04, "fc2", 1)],
            2: [start, {"event": "eval", "step": 200, "train_loss": 2.0, "val_loss": 2.1, "lr": 0.1,
                        "rank_spread": 0.0},
                {"event": "done", "step": 200, "val_loss": 2.1}],
            3: [start, diverged(150, 0.075, "fc2", 1)]}
    runs = [lab.runs.Run("baseline", "0.1", seed, str(tmp_path / "baseline" / "0.1" / str(seed))) for seed in logs]
    for run in runs:
        write_log(run.dir, logs[run.seed])
    [row] = lab.summary.ramp_rows([lab.summary.run_record(run) for run in runs])
    assert (row["runs"], row["diverged"], row["spikes"]) == (4, 3, 1)
    assert (row["steps_survived_median"], row["steps_survived_min"], row["steps_survived_max"]) == (135, 80, 200)
    assert row["peak_lr_median"] == pytest.approx((0.06 + 0.075) / 2)
    assert (row["peak_lr_min"], row["peak_lr_max"]) == (0.04, 0.1)
    assert (row["failed_op"], row["failed_op_count"]) == ("fc2 layer 1", 2)


def test_ramp_rows_name_the_op_that_grew_the_most_where_none_crossed(tmp_path):
    """Runs that another rule ended name the op that grew the most (train.py --fp16_overflow_fails): counted per
    op across seeds, whatever its ratio; an op outside the blocks has no layer."""
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}

    def grew(op, layer, ratio):
        event = diverged(100, 0.5, "fc2", 0)
        return {**event, "failed_op": None, "grew_most": {"layer": layer, "op": op, "module": "m", "from": 1.0,
                                                          "to": ratio, "ratio": ratio, "steps": 9}}

    logs = {0: grew("logits", None, 3.0), 1: grew("fc2", 16, 40.0), 2: grew("logits", None, 7.5)}
    runs = [lab.runs.Run("dn", "1.5", seed, str(tmp_path / "dn" / "1.5" / str(seed))) for seed in logs]
    for run in runs:
        write_log(run.dir, [start, logs[run.seed]])
    records = [lab.summary.run_record(run) for run in runs]
    assert [r["grew_most"] for r in records] == ["logits (x3)", "fc2 layer 16 (x40)", "logits (x7.5)"]
    assert all(r["failed_op"] is None for r in records)
    [row] = lab.summary.ramp_rows(records)
    assert (row["grew_most"], row["grew_most_count"], row["failed_op"]) == ("logits", 2, None)


def write_vocab(run_dir, vocab_size=256):
    """A config.json whose data names the tokenizer's vocabulary, which sets the failure loss ln(V)."""
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump({"model": {}, "train": {}, "data": {"vocab_size": vocab_size}}, f)


def test_lr_summary_from_logs(tmp_path):
    """Two LRs x two seeds; one run diverges and counts at the failure loss F = ln(V) in L(lr) and the sensitivity,
    as the claims count it, not at the variant's median L_0 (5.5 here)."""
    finals = {("1e-2", 0): 2.0, ("1e-2", 1): 2.4, ("1e-1", 0): 3.0, ("1e-1", 1): None}
    runs = []
    for (lr, seed), final in finals.items():
        run = lab.runs.Run("norm=rmsnorm", lr, seed, str(tmp_path / "v" / lr / str(seed)))
        start = {"event": "eval", "step": 0, "train_loss": 5.0, "val_loss": 5.0 + seed, "lr": 0.0, "rank_spread": 0.0}
        end = ([{"event": "eval", "step": 10, "train_loss": final, "val_loss": final, "lr": float(lr),
                 "rank_spread": 0.0}, {"event": "done", "step": 10, "val_loss": final}]
               if final else [diverged(7, float(lr), "q@k", 0)])
        write_log(run.dir, [start, *end])
        write_vocab(run.dir)
        runs.append(run)
    [row] = lab.summary.lr_rows([lab.summary.run_record(run) for run in runs], ["1e-2", "1e-1"])
    l_small, l_large = (2.0 + 2.4) / 2, (3.0 + LN_V) / 2  # medians over seeds, the diverged run at ln 256
    assert (row["best_lr"], row["best_loss"], row["diverged"]) == ("1e-2", pytest.approx(l_small), 1)
    assert (row["L(1e-1)"], row["failure_loss"], row["init_loss"]) == (pytest.approx(l_large), LN_V, 5.5)
    assert row["lr_sensitivity"] == pytest.approx(((l_small - l_small) + (l_large - l_small)) / 2, abs=1e-15)


@pytest.mark.parametrize("mode", ["lr", pytest.param("ramp", marks=pytest.mark.skipif(
    not HAS_RAMP, reason="train.py has no --lr_schedule=ramp yet"))])
def test_dry_run_commands_parse_with_train_parser(tmp_path, capsys, mode):
    variants = "baseline,norm=rmsnorm,preset=normformer+scale_heads=False"
    code = sweep.main([f"--variants={variants}", "--lrs=3e-3,1e-2", "--seeds=2", f"--mode={mode}", "--dry_run",
                       f"--out_dir={tmp_path}", "--max_iters=7", "--n_layer=3"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and len(lines) == 3 * 2 * 2
    seen = set()
    for line in lines:
        given = configs.parse_flags(shlex.split(line)[2:])
        model_cfg, tc = configs.build_configs(given)
        assert (tc.max_iters, model_cfg.n_layer) == (7, 3)
        variant, lr, seed = os.path.relpath(tc.out_dir, tmp_path).split(os.sep)
        assert (float(lr), int(seed)) == (tc.lr, tc.seed)
        assert (tc.lr_schedule == "ramp") == (mode == "ramp")
        expect_norm = "rmsnorm" if variant == "norm=rmsnorm" else "layernorm"
        assert model_cfg.norm == expect_norm
        normformer = "normformer" in variant
        assert (model_cfg.scale_attn, model_cfg.scale_heads) == ((True, False) if normformer else (False, False))
        seen.add((variant, lr, seed))
    assert len(seen) == 12


@pytest.mark.parametrize("flags, expected", [
    (["--batch_size=0"], "variant baseline: --batch_size=0 must be a positive integer"),
    (["--device=tpu"], "--device=tpu is not a device"),
    (["--warmup_iters=9", "--max_iters=4"], "--warmup_iters=9 must be in [0, --max_iters=4]"),
    (["--lrs=1_0"], "--lrs=1_0 is not a valid float"),
    (["--lrs=\u0661e-2"], "is not a valid float"),
])
def test_the_runs_flags_pass_train_checks_before_anything_starts(tmp_path, capsys, flags, expected):
    """What train.py would refuse at its start is refused for every run before the first starts, --dry_run too."""
    assert sweep.main([*without(["--variants=baseline", "--lrs=1e-2"], flags), *flags, "--dry_run",
                       f"--out_dir={tmp_path / 's'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1, err


@pytest.mark.skipif(sweep.runtime.torch.cuda.is_available(), reason="a machine with a GPU runs --device=cuda")
def test_a_device_this_machine_lacks_is_refused_unless_the_commands_are_for_another(tmp_path, capsys):
    argv = ["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 's'}", *without(SWEEP_TINY, ["--device"]),
            "--device=cuda"]
    assert sweep.main(argv) == 2
    assert "--device=cuda: CUDA is not available here" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "s")
    assert sweep.main([*argv, "--dry_run"]) == 0  # commands for a GPU node, printed on a CPU login node


@pytest.mark.parametrize("flags, expected", [
    (["--variants=norm=groupnorm", "--lrs=1e-2"], "groupnorm"),
    (["--variants=baseline", "--lrs=1e-2", "--lr=3"], "--lr is set per run"),
    (["--variants=baseline", "--lrs=fast"], "fast"),
    (["--variants=baseline"], "--lrs"),
    (["--variants=baseline", "--lrs=1e-2,3e-3,0.01"], "1e-2 and 0.01 are the same LR"),
    (["--variants=baseline", "--lrs=1e-2,1e-2"], "1e-2 and 1e-2 are the same LR"),
    (["--variants=baseline,postln,preset=baseline", "--lrs=1e-2"], "baseline and preset=baseline are the same runs"),
    (["--variants=baseline,baseline", "--lrs=1e-2"], "baseline and baseline are the same runs"),
    (["--variants=baseline+lr=1", "--lrs=1e-2"], "variant baseline+lr=1: lr is set per run"),
    (["--variants=postln,baseline+seed=3", "--lrs=1e-2"], "variant baseline+seed=3: seed is set per run"),
    (["--variants=baseline+out_dir=x", "--lrs=1e-2"], "out_dir is set per run"),
    (["--variants=baseline+lr_schedule=cosine", "--lrs=1e-2", "--mode=ramp"], "lr_schedule is set per run"),
    (["--variants=baseline", "--lrs=1e-2", "--jobs=100000"], "--jobs=100000 must be an integer from 1"),
    (["--variants=baseline", "--lrs=1e-2", "--jobs=100000000000"], "--jobs=100000000000 is too large"),
    (["--variants=baseline", "--lrs=1e-2", "--seeds=\u0663"], "--seeds"),
    (["--variants=baseline", "--lrs=1e-2", "--jobs=1e11"], "--jobs"),
    (["--variants=baseline", "--lrs=1e-2", "--dry_run=on"], "--dry_run"),
    # --lrs and --variants are capped as --seeds is: a million runs' flags would take hours to resolve
    (["--variants=baseline", "--lrs=" + ",".join(f"{i + 1}e-3" for i in range(1000)), "--seeds=1000", "--dry_run"],
     "1 variants x 1,000 LRs x 1,000 seeds are 1,000,000 runs; a sweep has at most 10,000"),
    (["--variants=" + ",".join(f"norm=rmsnorm+n_layer={i + 1}" for i in range(10_001)), "--lrs=1e-2", "--dry_run"],
     "10,001 variants x 1 LRs x 1 seeds are 10,001 runs"),
    # issue 55: an empty list was called "required", and an empty item was dropped without a word
    (["--variants=", "--lrs=1e-2"], "--variants= is empty; give one or more, comma-separated, e.g. "
     "--variants=baseline,norm=powernorm"),
    (["--variants=baseline", "--lrs="], "--lrs= is empty; give one or more, comma-separated, e.g. --lrs=3e-3,1e-2"),
    (["--variants=baseline,,postln", "--lrs=1e-2"], "--variants=baseline,,postln has an empty item"),
    (["--variants=baseline", "--lrs=1e-2,"], "--lrs=1e-2, has an empty item"),
    (["--variants=baseline", "--lrs=inf"], "--lrs=inf is not a finite number"),
    (["--variants=baseline", "--lrs=0"], "--lrs: 0 is not a positive number"),
    (["--variants=norm=rmsnorm+data_dir=../../x", "--lrs=1e-2", "--dry_run"],
     "variant norm=rmsnorm+data_dir=../../x: a variant names a folder"),
    (["--variants=baseline,dataset=/tmp/c.txt", "--lrs=1e-2", "--dry_run"], "give a path as a flag to every run"),
    (["--variants=norm=rmsnorm,norm=rmsnorm+bias=True", "--lrs=1e-2", "--dry_run"],
     "norm=rmsnorm and norm=rmsnorm+bias=True are the same runs"),
    (["--variants=baseline,preset=baseline+n_layer=4", "--lrs=1e-2", "--dry_run"], "are the same runs"),  # 4: default
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, expected):
    assert sweep.main([*flags, f"--out_dir={tmp_path / 'sweep'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "sweep")


def snapshot(run_dir):
    path = os.path.join(run_dir, "log.jsonl")
    with open(path) as f:
        return os.stat(path).st_mtime_ns, f.read()


def steps_of(run_dir, kind):
    return [e["step"] for e in lab.runs.read_events(run_dir) if e["event"] == kind]


@pytest.mark.slow
def test_skip_and_resume_a_half_finished_sweep(corpus, tmp_path, capsys):
    """One run finished, one interrupted after its step-2 checkpoint, one never started: re-running the sweep
    runs nothing twice, loses nothing, and every run ends finished."""
    common = [f"--out_dir={tmp_path / 'sweep'}", "--lrs=1e-2", "--jobs=2", f"--dataset={corpus}",
              f"--data_dir={tmp_path / 'data'}", *SWEEP_TINY]
    args = sweep.parse_args(["--variants=baseline,norm=rmsnorm,postln", *common])
    done, interrupted, fresh = sweep.grid(args)
    os.makedirs(os.path.dirname(done.dir))
    with open(done.dir + ".exit", "w") as f:  # what sweep.py records after a run
        f.write(f"{train.main(sweep.train_flags(done, args))}\n")
    finished_before = snapshot(done.dir)

    real_save = run_folder.save_checkpoint

    def save_then_stop(out_dir, state, keep):  # a crash right after the first checkpoint (step 2 of 4)
        real_save(out_dir, state, keep)
        raise KeyboardInterrupt

    run_folder.save_checkpoint = save_then_stop
    try:
        train.main(sweep.train_flags(interrupted, args))
    except KeyboardInterrupt:
        pass
    finally:
        run_folder.save_checkpoint = real_save
    assert steps_of(interrupted.dir, "eval") == [0, 2] and not lab.runs.is_finished(interrupted)
    interrupted_before = snapshot(interrupted.dir)[1]
    assert "--resume" in sweep.train_flags(interrupted, args)

    assert sweep.main(["--variants=baseline,norm=rmsnorm,postln", *common]) == 0
    assert "3 runs, 1 finished already, 0 running elsewhere, 2 to run" in capsys.readouterr().out
    assert snapshot(done.dir) == finished_before
    assert snapshot(interrupted.dir)[1].startswith(interrupted_before)  # continued, not started again
    for run in (done, interrupted, fresh):
        assert steps_of(run.dir, "eval") == [0, 2, 4]
        assert steps_of(run.dir, "train") == [1, 2, 3, 4]
        assert lab.runs.is_finished(run) and lab.runs.exit_code(run) == 0
    after = [snapshot(run.dir) for run in (done, interrupted, fresh)]
    assert sweep.main(["--variants=baseline,norm=rmsnorm,postln", *common]) == 0
    assert "0 to run" in capsys.readouterr().out
    assert [snapshot(run.dir) for run in (done, interrupted, fresh)] == after
    with open(tmp_path / "sweep" / "summary.json") as f:
        rows = json.load(f)["variants"]
    assert [row["variant"] for row in rows] == ["baseline", "norm=rmsnorm", "postln"]
    assert all(row["runs"] == 1 and math.isfinite(row["best_loss"]) for row in rows)

    # stopped between its final checkpoint and its "done" line, its resume refused: finished, and never run again
    log = os.path.join(done.dir, "log.jsonl")
    with open(log) as f:
        lines = f.readlines()
    assert json.loads(lines[-1])["event"] == "done" and os.path.exists(os.path.join(done.dir, "ckpt-4.pt"))
    with open(log, "w") as f:
        f.writelines(lines[:-1])
    with open(done.dir + ".exit", "w") as f:
        f.write("2\n")
    assert sweep.main(["--variants=baseline,norm=rmsnorm,postln", *common]) == 0
    assert "3 runs, 3 finished already, 0 running elsewhere, 0 to run" in capsys.readouterr().out
    with open(tmp_path / "sweep" / "summary.json") as f:
        assert [r["status"] for r in json.load(f)["runs"]] == ["done"] * 3


def test_runs_whose_checkpoints_are_all_damaged_exit_4_naming_them_and_what_to_do(corpus, tmp_path, capsys):
    """Every run resumable from checkpoints that do not load: train.py refuses each resume (exit code 2), so the
    sweep exits 4 with one line that counts them, names the first and says how to train it afresh (a re-run would
    resume it again, to the same end), and a summary that says every run failed."""
    argv, runs = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    for run in runs:
        write_log(run.dir, [start])
        write_config(run, argv)
        for name in ("ckpt.pt", "ckpt-2.pt"):
            with open(os.path.join(run.dir, name), "wb") as f:
                f.write(b"not a checkpoint")
    assert sweep.main([*argv, "--jobs=2"]) == 4
    assert capsys.readouterr().err == (
        f"sweep.py: 2 of 2 runs failed (they crashed or were refused: see their .out files); train.py refused to "
        f"resume {runs[0].dir} (and 1 more), as it will on every re-run (its .out says why): remove the run (its "
        "folder, .exit and .out) to train it afresh; exit code 4\n")
    with open(runs[0].dir + ".out") as f:
        assert "train.py: --resume: " in f.read()
    with open(tmp_path / "sweep" / "summary.json") as f:
        summary = json.load(f)
    assert summary["failed_runs"] == 2 and [r["status"] for r in summary["runs"]] == ["unfinished"] * 2


def binary_file(folder):
    path = folder / "binary.bin"
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.mark.parametrize("flags, expected", [
    (lambda tmp: [f"--dataset={tmp / 'missing.txt'}"], "variant baseline: --dataset="),
    (lambda tmp: [f"--dataset={binary_file(tmp)}"], "binary.bin is not UTF-8 text"),
    (lambda tmp: ["--variants=postln,baseline+block_size=5000"], "variant baseline+block_size=5000: the val split "),
    (lambda tmp: ["--variants=postln,baseline+n_embd=65536"], "variant baseline+n_embd=65536: the model and its "
                                                               "training need about"),
], ids=["missing corpus", "binary corpus", "block longer than a split", "out of memory"])
def test_a_run_train_py_would_refuse_is_refused_before_any_run_starts(corpus, tmp_path, capsys, monkeypatch, flags,
                                                                      expected):
    """A corpus that is not there or not text, a block longer than a split, a model the machine cannot hold: what
    train.py refuses before it trains, for any run of the grid (the last one too), is one line and exit code 2
    before the first run starts or the sweep folder is made."""
    monkeypatch.setattr(sweep.pool, "run_all", lambda *args: pytest.fail("a run was started"))
    extra = flags(tmp_path)
    variants = [part for e in extra if e.startswith("--variants=") for v in e[11:].split(",") for part in v.split("+")]
    argv = [*without(["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 'sweep'}", f"--dataset={corpus}",
                      f"--data_dir={prepared(corpus)}", *SWEEP_TINY], extra + [f"--{v}" for v in variants]), *extra]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1, err
    assert not os.path.exists(tmp_path / "sweep")


def test_a_damaged_exit_file_is_refused_before_the_other_runs_train(corpus, tmp_path, capsys, monkeypatch):
    """A finished run's <seed>.exit that holds no exit code is one line naming the file and its text, before the
    run left to do trains (not once it has)."""
    argv, (finished, left) = two_runs(tmp_path, corpus)
    finished_as(finished, argv)
    with open(finished.dir + ".exit", "w") as f:
        f.write("xyz\n")
    monkeypatch.setattr(sweep.pool, "run_all", lambda *args: pytest.fail("a run was started"))
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sweep.py: {finished.dir}.exit: ") and "xyz" in err and err.count("\n") == 1, err
    assert not os.path.exists(left.dir) and not os.path.exists(tmp_path / "sweep" / "summary.json")


def test_each_variant_meets_the_reference_of_its_own_context():
    variants = ["dn_postln+n_layer=6", "dn_deepnorm+n_layer=6", "dn_postln+n_layer=18", "dn_deepnorm+n_layer=18",
                "dn_deepnorm+n_layer=36"]
    assert lab.summary.references(variants, "dn_postln+n_layer=6") == {
        "dn_deepnorm+n_layer=6": "dn_postln+n_layer=6", "dn_deepnorm+n_layer=18": "dn_postln+n_layer=18",
        "dn_deepnorm+n_layer=36": "dn_postln+n_layer=6"}  # no 36-layer Post-LN: the reference itself
    # the reference's own overrides (init=xavier) are its context, not a difference the variant must share
    assert lab.summary.references(["postln+init=xavier", "postln+init=xavier+n_layer=18", "deepnorm+n_layer=18"],
                            "postln+init=xavier") == {"deepnorm+n_layer=18": "postln+init=xavier+n_layer=18"}
    assert lab.summary.references(["baseline", "qk_norm=True", "normformer+z_loss=1e-4", "baseline+z_loss=1e-4"],
                            "baseline") == {"qk_norm=True": "baseline",
                                            "normformer+z_loss=1e-4": "baseline+z_loss=1e-4"}


def record(variant, lr, seed, status, **values):
    """A run record as lab/summary.run_record makes it: its loss capped at the failure loss ln 256."""
    base = {"variant": variant, "lr": lr, "seed": seed, "status": status, "final_loss": None, "spikes": 0,
            "steps_survived": None, "peak_lr": None, "attn_logit_max": None, "log_z": None, "init_loss": 4.0,
            "diverged": status == "diverged", "failure_loss": LN_V, "left_plateau": None}
    record = {**base, **values}
    loss = record["final_loss"]
    return {**record, "final_loss_capped": None if loss is None else min(loss, record["failure_loss"])}


def test_comparisons_pair_runs_by_seed_and_count_a_diverged_run_at_the_failure_loss():
    """lr mode, 6 seeds a side: at 1e-2 the variant beats the reference on every seed (one reference seed diverged:
    its loss counts as ln 256, not as its L_0 = 4.0), so the sign-flip p is 2/64; best_loss takes each variant at its
    own best LR."""
    seeds = range(6)
    records = [record("v", "1e-2", s, "done", final_loss=2.0 + s / 10) for s in seeds]
    records += [record("ref", "1e-2", s, "done", final_loss=3.0 + s / 10) for s in seeds[:5]]
    records += [record("ref", "1e-2", 5, "diverged", final_loss=math.inf)]
    records += [record("v", "1e-3", s, "done", final_loss=2.5) for s in seeds]
    records += [record("ref", "1e-3", s, "done", final_loss=2.4 + s / 100) for s in seeds]
    rows = {row["metric"]: row for row in lab.summary.comparisons(records, "lr", ["1e-3", "1e-2"], ["ref", "v"], "ref")}
    assert set(rows) == {"final_loss@1e-3", "spikes@1e-3", "final_loss@1e-2", "spikes@1e-2", "best_loss"}
    row = rows["final_loss@1e-2"]
    assert row["reference_values"] == {"median": pytest.approx(3.25), "min": 3.0, "max": LN_V, "n": 6}
    assert (row["test"], row["pairs"], row["p_exact"], row["verdict"]) == ("paired sign-flip", 6, "1/32", "agrees")
    # 2.5 on all 6 seeds against 2.40-2.45: the variant is worse on every seed
    assert (rows["final_loss@1e-3"]["observed"], rows["final_loss@1e-3"]["verdict"]) == ("worse", "disagrees")
    assert (rows["best_loss"]["lr"], rows["best_loss"]["reference_lr"]) == ("1e-2", "1e-3")
    assert rows["spikes@1e-2"]["p"] == 1.0  # no spikes on either side: every difference 0


def test_comparisons_without_shared_seeds_fall_back_to_the_unpaired_test():
    # the reference's seed 3 did not finish: the sides' seeds differ, so no pairs; Mann-Whitney with inf as the worst
    records = [record("v", "1e-2", s, "done", final_loss=2.0 + s / 10) for s in range(4)]
    records += [record("ref", "1e-2", s, "diverged", final_loss=math.inf) for s in range(3)]
    records += [record("ref", "1e-2", 3, "unfinished")]
    [row] = [r for r in lab.summary.comparisons(records, "lr", ["1e-2"], ["ref", "v"], "ref")
             if r["metric"] == "final_loss@1e-2"]
    assert row["test"] == "Mann-Whitney" and row["reference_values"]["median"] == math.inf
    assert row["p_exact"] == "2/35"  # complete separation, 2 of C(7, 3) relabelings


NO_EFFECT = "not detected (no effect is detectable with these seeds)"


@pytest.mark.parametrize("values, reference, better, expect, verdict, observed", [
    ([500, 520, 540, 560, 580], [300, 310, 320, 330, 340], "higher", "better", "agrees", "better"),
    ([500, 520, 540, 560, 580], [300, 310, 320, 330, 340], "higher", "worse", "disagrees", "better"),
    ([2.0, 2.1, 2.2, 2.3, 2.4], [1.0, 1.1, 1.2, 1.3, 1.4], "lower", "better", "disagrees", "worse"),
    ([1.0, 1.1, 1.2, 1.3, 1.4], [math.inf] * 5, "lower", "better", "agrees", "better"),
    ([1.0, 1.2, 1.4], [1.1, 1.3, 1.5], "lower", "better", NO_EFFECT, "better"),  # 3 a side: p >= 0.1
    ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], "lower", "better", NO_EFFECT, "better"),  # p = 0.1
])
def test_unpaired_verdicts(values, reference, better, expect, verdict, observed):
    result = lab.summary.unpaired(values, reference, better, expect)
    assert (result["verdict"], result["observed"]) == (verdict, observed)
    assert result["variant_values"]["n"] == len(values) and result["reference_values"]["n"] == len(reference)


def test_unpaired_reports_medians_spread_the_exact_p_and_what_it_could_detect():
    result = lab.summary.unpaired([2.0, 2.1, math.inf, math.inf], [math.inf, math.inf, math.inf, 3.0], "lower",
                                  "better")
    assert result["variant_values"] == {"median": math.inf, "min": 2.0, "max": math.inf, "n": 4}
    assert result["reference_values"] == {"median": math.inf, "min": 3.0, "max": math.inf, "n": 4}
    assert result["median_difference"] is None  # inf - inf
    assert (result["p_exact"], result["p"]) == ("3/7", pytest.approx(3 / 7))
    assert result["verdict"].endswith("the minimum detectable effect, is unknown)")  # one finite reference value
    # 5 a side, overlapping: not detected, with the MDE of 5 vs 5 at the pooled spread (both sides' sd 1.5811)
    result = lab.summary.unpaired([1.0, 2.0, 4.0, 5.0, 3.0], [3.0, 6.0, 7.0, 5.0, 4.0], "lower", "better")
    assert result["median_difference"] == 3.0 - 5.0 and result["smallest_p"] == pytest.approx(2 / 252)
    mde = lab.stats.rank_sum_mde(5, 5, math.sqrt(2.5))
    assert result["mde"] == mde and result["verdict"] == f"not detected (observed minimum detectable effect {mde:.3g})"


def test_paired_not_detected_names_the_minimum_detectable_mean_difference():
    ours = {s: 2.0 + d for s, d in enumerate([0.1, -0.2, 0.3, -0.1, 0.2, 0.05])}
    theirs = {s: 2.0 for s in range(6)}
    row = lab.summary.paired(ours, theirs, "lower", "better")
    mde = lab.stats.minimum_detectable_effect(6, statistics.stdev([ours[s] - 2.0 for s in range(6)]),
                                              trials=lab.summary.ROW_TRIALS)
    assert row["p"] > 0.05 and row["mde"] == mde
    assert row["verdict"] == f"not detected (observed minimum detectable effect {mde:.3g})"


@pytest.mark.parametrize("flags, expected", [
    (["--recipe=normformer"], "--recipe=normformer is not allowed; choose one of normformer_stability"),
    (["--recipe=powernorm", "--variants=baseline"], "--variants come from the recipe"),
    (["--recipe=powernorm", "--seeds=9"], "a recipe's seeds are part of its design; edit lab/recipes.py and re-run "
                                          "the whole recipe"),
    (["--recipe=powernorm", "--first_seed=2"], "a recipe's seeds are part of its design"),
    # a variant's flag comes after the command line's: the user's would change nothing
    (["--recipe=deepnorm_depth", "--n_layer=2"], "--n_layer is set by the recipe's variants (dn_postln+n_layer=6)"),
    (["--recipe=z_loss_lr", "--weight_decay=0.1"], "--weight_decay is set by the recipe's variants"),
    (["--recipe=powernorm", "--preset=baseline"], "--preset is set by the recipe's variants"),
    # an explicit flag wins over a preset's: one an arm's preset sets would change that arm without a word
    (["--recipe=normformer_stability", "--scale_fc=False"],
     "--scale_fc is set by the preset of the recipe's variant nf_normformer: given on the command line it would "
     "change that arm"),
    (["--recipe=powernorm", "--norm=rmsnorm"], "--norm is set by the preset of the recipe's variant pn_layernorm"),
    (["--variants=baseline", "--lrs=1e-2", "--first_seed=-1"], "--first_seed=-1 must be an integer from 0"),
    (["--variants=baseline", "--lrs=1e-2", "--scale=gpu"], "--scale sizes a recipe"),
    (["--variants=baseline,postln", "--lrs=1e-2", "--reference=normformer"], "--reference=normformer is not one of"),
])
def test_recipe_and_reference_bad_input_is_one_line(tmp_path, capsys, flags, expected):
    # --dry_run: were the input taken, the sweep would print its commands, not run a recipe
    assert sweep.main([*flags, "--dry_run", f"--out_dir={tmp_path / 'sweep'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "sweep")


@pytest.mark.skipif(sweep.runtime.torch.cuda.is_available(), reason="a machine with a GPU runs --scale=gpu")
def test_a_gpu_sized_recipe_is_refused_on_a_cpu_unless_asked_for(tmp_path, capsys):
    argv = ["--recipe=powernorm", "--scale=gpu", f"--out_dir={tmp_path / 's'}"]
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: --scale=gpu is the recipe at a GPU's size") and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "s")
    assert sweep.parse_args([*argv, "--dry_run"]).scale == "gpu"  # the commands, for a GPU node
    assert sweep.parse_args([*argv, "--device=cpu"]).scale == "gpu"  # here, as the command line says


def test_a_recipe_takes_extra_flags_after_its_own_and_runs_its_own_seeds():
    args = sweep.parse_args(["--recipe=powernorm", "--device=cpu", "--max_iters=50"])
    powernorm = recipes.RECIPES["powernorm"]
    assert powernorm.pilot == 3 and args.seeds == 3 + powernorm.tested_seeds  # 3 pilot seeds first
    assert args.out_dir == os.path.join("sweeps", "powernorm")
    assert args.train_argv[-2:] == ["--device=cpu", "--max_iters=50"]  # after the recipe's --max_iters: they win
    assert configs.parse_flags(args.train_argv)["max_iters"] == 50
    gpu = sweep.parse_args(["--recipe=powernorm", "--scale=gpu", "--dry_run"])
    assert gpu.out_dir == os.path.join("sweeps", "powernorm_gpu")
    # normformer_loss: the pilot seeds 100-102 pick its LRs; --pilot runs only them, the recipe all of them
    recipe = recipes.RECIPES["normformer_loss"]
    pilot = {run.seed for run in sweep.grid(sweep.parse_args(["--recipe=normformer_loss", "--pilot"]))}
    assert pilot == {100, 101, 102}
    every = {run.seed for run in sweep.grid(sweep.parse_args(["--recipe=normformer_loss"]))}
    assert every == set(range(100, 103 + recipe.tested_seeds))


def test_a_recipe_records_its_design_hash_before_its_runs_start(tmp_path, monkeypatch):
    # the pool is replaced by a look at design.json as the runs would start: the hash is there before any runs
    seen = []
    monkeypatch.setattr(sweep.pool, "run_all", lambda todo, jobs, command: seen.append(
        json.loads((tmp_path / "s" / "design.json").read_text())) or 2)
    argv = ["--recipe=qk_norm_lr", "--pilot", f"--out_dir={tmp_path / 's'}"]
    plan = sweep.parse_args(argv)
    runs = sweep.grid(plan)
    sweep.run_sweep(plan, runs, runs, {}, None)
    [[entry]] = seen
    assert entry["sha256"] == recipes.design_hash("qk_norm_lr") and entry["stage"] == "pilot"
    # the same stage and design again: recorded once; the design changed: recorded beside the first
    sweep.run_sweep(plan, runs, runs, {}, None)
    monkeypatch.setattr(recipes.RECIPES["qk_norm_lr"], "tested_seeds", recipes.RECIPES["qk_norm_lr"].tested_seeds + 1)
    sweep.run_sweep(sweep.parse_args(argv), runs, runs, {}, None)
    assert len(seen[1]) == 1 and len(seen[2]) == 2 and seen[2][1]["sha256"] != entry["sha256"]
    assert sweep.main(["--variants=baseline", "--lrs=1e-2", "--pilot", "--dry_run"]) == 2


def test_a_plain_sweep_runs_seeds_from_first_seed():
    plan = sweep.parse_args(["--variants=baseline", "--lrs=1e-2", "--seeds=3", "--first_seed=5"])
    assert [run.seed for run in sweep.grid(plan)] == [5, 6, 7]


@pytest.mark.parametrize("event, expected", [
    ({"reason": "mean loss of the last 10 steps 4.7988 is 1.53 above its best 3.2648 (gap 1.5)"}, "loss gap"),
    ({"reason": "loss 7.1000 above the bound 6.5000 for 3 steps"}, "loss bound"),
    ({"reason": "non-finite loss (nan) or gradient norm (inf)"}, "non-finite loss"),
    ({"reason": "non-finite validation loss (nan)"}, "non-finite val loss"),
    ({"reason": "q@k at layer 0 is above 65504", "criterion": "fp16 overflow"}, "fp16 overflow"),
])
def test_the_rule_that_ended_a_run(event, expected):
    assert lab.summary.criterion(event) == expected


@pytest.mark.parametrize("make, out_dir, expected", [
    (lambda tmp: None, "", "--out_dir is empty"),
    (lambda tmp: (tmp / "file").write_text("mine"), "file", "is a file, not a folder"),
    (lambda tmp: (tmp / "file").write_text("mine"), "file/sweep", "is inside"),
    (lambda tmp: (tmp / "file").write_text("mine") and (tmp / "link").symlink_to(tmp / "nowhere"), "link",
     "is a symlink to"),
])
def test_an_out_dir_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, make, out_dir, expected):
    make(tmp_path)
    path = str(tmp_path / out_dir) if out_dir else ""
    assert sweep.main(["--variants=baseline", "--lrs=1e-2", f"--out_dir={path}", "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1
    if out_dir:
        assert (tmp_path / "file").read_text() == "mine"


def two_runs(tmp_path, corpus):
    """A two-seed sweep's args and runs on corpus (nothing run yet), its data prepared beside corpus."""
    argv = ["--variants=baseline", "--lrs=1e-2", "--seeds=2", f"--out_dir={tmp_path / 'sweep'}",
            f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", *SWEEP_TINY]
    args = sweep.parse_args(argv)
    return argv, sweep.grid(args)


def test_a_run_that_diverged_without_an_exit_file_counts_as_finished_from_its_log(corpus, tmp_path, capsys):
    """A run started from --dry_run's commands (on a cluster) leaves no <seed>.exit: its log alone says it ended."""
    argv, (ended, fresh) = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    write_log(ended.dir, [start, diverged(3, 0.01, "fc2", 0)])
    write_config(ended, argv)
    assert lab.runs.is_finished(ended) and not os.path.exists(ended.dir + ".exit")
    assert sweep.main([*argv, "--dry_run"]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 1 and f"--out_dir={fresh.dir}" in commands[0]
    assert (lab.summary.run_record(ended)["status"] == "diverged"
            and lab.summary.run_record(ended)["final_loss"] == math.inf)


def test_torn_and_foreign_logs_exit_files_and_summaries(corpus, tmp_path, capsys):
    """A torn last line is left out with a note; a foreign line, a folder in the log's place, a damaged .exit or
    summary.json is one line and exit code 2, and nothing is written."""
    argv, (first, second) = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    write_log(first.dir, [start, diverged(3, 0.01, "fc2", 0)])
    with open(os.path.join(first.dir, "log.jsonl"), "a") as f:
        f.write('{"event": "tra')  # a SIGKILL mid-write
    assert lab.runs.is_finished(first)
    assert any("the last line was cut short" in note for note in lab.runs.NOTES)
    # said once by a sweep whose checks pass, however often the log is read
    write_config(first, argv)
    assert sweep.main([*argv, "--dry_run"]) == 0
    err = capsys.readouterr().err
    assert err.count("the last line was cut short") == 1, err
    shutil.rmtree(first.dir)  # whole again, so that each line below is the one error
    write_log(first.dir, [start, diverged(3, 0.01, "fc2", 0)])
    write_config(first, argv)

    def refused(expected):
        before = sorted(os.listdir(tmp_path / "sweep"))
        assert sweep.main([*argv, "--dry_run"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sweep.py: ") and expected in err and err.count("\n") == 1, err
        assert sorted(os.listdir(tmp_path / "sweep")) == before

    os.makedirs(os.path.join(second.dir, "log.jsonl"))
    refused("log.jsonl is a folder, not a file")
    os.rmdir(os.path.join(second.dir, "log.jsonl"))
    with open(os.path.join(second.dir, "log.jsonl"), "w") as f:
        f.write('{"event": "eval", "step": 0}\n[1, 2]\n{"event": "eval", "step": 1}\n')
    refused("log.jsonl:2: not an event")
    os.remove(os.path.join(second.dir, "log.jsonl"))

    with open(second.dir + ".exit", "w") as f:
        f.write("")  # sweep.py killed while writing it: no exit code recorded
    assert lab.runs.exit_code(second) is None
    with open(second.dir + ".exit", "w") as f:
        f.write("garbage\n")
    refused("is not an exit code")
    os.remove(second.dir + ".exit")

    summary = tmp_path / "sweep" / "summary.json"
    summary.write_text('{"mode": "lr", "wall_s": 12')
    refused("summary.json is not a summary sweep.py wrote")
    assert summary.read_text() == '{"mode": "lr", "wall_s": 12'
    summary.write_text("[]")
    refused("summary.json is not a summary sweep.py wrote")


HOLD = """
import sys, time
sys.path.insert(0, {here!r})
from engine import files
lock = files.claim({folder!r})
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_refusal_after_a_torn_line_is_one_line(corpus, tmp_path, capsys):
    """A log cut mid-line beside a .exit that says done: the refusal alone (the torn line's note came first)."""
    argv, (first, _) = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    write_log(first.dir, [start])
    with open(os.path.join(first.dir, "log.jsonl"), "a") as f:
        f.write('{"event": "done", "st')
    write_config(first, argv)
    with open(first.dir + ".exit", "w") as f:
        f.write("0\n")
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sweep.py: {first.dir}.exit records exit code 0 (done)") and err.count("\n") == 1, err


@pytest.mark.parametrize("damage, says", [
    (lambda path: path.write_text("{"), "design.json: not JSON"),
    (lambda path: path.write_text('"hello"'), "design.json: design is a string, not a list"),
    (lambda path: path.write_text('[{"sha256": 5, "stage": "pilot"}]'), "design[0].sha256 is an integer, not a string"),
    (lambda path: path.mkdir(), "design.json is a folder, not a file"),
    (lambda path: os.mkfifo(path), "design.json is not a regular file"),
])
def test_a_damaged_design_record_is_one_line_before_any_run(corpus, tmp_path, capsys, damage, says):
    """design.json, the record of the design the runs started under, which the summary carries: a traceback (not
    JSON, a folder), a sweep that waited forever (a FIFO) or a summary that published "hello" as its design."""
    argv, runs = two_runs(tmp_path, corpus)
    os.makedirs(tmp_path / "sweep")
    damage(tmp_path / "sweep" / "design.json")
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and says in err and err.count("\n") == 1, err
    assert not any(os.path.exists(run.dir) for run in runs)


def test_a_run_whose_ckpt_pt_is_gone_resumes_from_its_numbered_checkpoint(corpus, tmp_path):
    """train.py --resume goes on from the newest ckpt-<step>.pt where ckpt.pt is gone: the sweep resumed nothing and
    passed --overwrite, which trained the run from step 0 and removed its checkpoints."""
    argv, (first, _) = two_runs(tmp_path, corpus)
    plan = sweep.parse_args(argv)
    os.makedirs(first.dir)
    (Path(first.dir) / "ckpt-400.pt").write_bytes(b"")
    assert "--resume" in sweep.train_flags(first, plan) and "--overwrite" not in sweep.train_flags(first, plan)
    assert "1 resume from a checkpoint, 0 start afresh" in sweep.stop_message(signal.SIGINT, [first])


def test_a_held_run_folder_is_left_to_its_holder_and_reported_as_running(corpus, tmp_path, capsys):
    """Another process holds one run's folder (a sweep started twice): this sweep neither starts that run nor
    counts it as failed; it runs the other one and says the first is still running."""
    argv, (held, free) = two_runs(tmp_path, corpus)
    holder = subprocess.Popen([sys.executable, "-c", HOLD.format(here=sweep.HERE, folder=held.dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert sweep.main([*argv, "--dry_run"]) == 0
        captured = capsys.readouterr()
        assert f"--out_dir={held.dir} " not in captured.out + " " and f"--out_dir={free.dir}" in captured.out
        assert f"{held.dir} is running in another process (PID {holder.pid} on" in captured.err
        assert sweep.main(argv) == 0
        captured = capsys.readouterr()
        assert f"{held.dir} is running in another process (PID {holder.pid}" in captured.err
        assert "2 runs, 0 finished already, 1 running elsewhere, 1 to run" in captured.out
        assert "1 of 2 runs did not finish (1 of them still running in another process" in captured.out
        assert sorted(os.listdir(held.dir)) == ["run.lock"] and not os.path.exists(held.dir + ".exit")
        assert lab.runs.exit_code(free) == 0
    finally:
        holder.kill()
        holder.wait()
    assert sweep.main(argv) == 0  # the holder is gone: now it runs
    assert lab.runs.exit_code(held) == 0 and "0 of 2" not in capsys.readouterr().out


def events_of(run_dir):
    return lab.runs.read_events(run_dir) if os.path.isfile(os.path.join(run_dir, "log.jsonl")) else []


@pytest.mark.slow
def test_sigterm_to_a_sweep_stops_its_runs_with_a_checkpoint_and_a_rerun_resumes(corpus, tmp_path):
    """A real SIGTERM to a real sweep.py: both train.py processes get it, write a checkpoint and exit 130, and
    sweep.py waits for them before it exits; no train.py is left running (no folder is still held)."""
    argv = ["--variants=baseline", "--lrs=1e-2,3e-3", "--jobs=2", f"--out_dir={tmp_path / 'sweep'}",
            f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", *SWEEP_TINY[:4], "--max_iters=100000",
            "--eval_interval=20", "--eval_iters=1", "--log_interval=1", "--warmup_iters=0"]
    runs = sweep.grid(sweep.parse_args(argv))
    process = subprocess.Popen([sys.executable, os.path.join(sweep.HERE, "sweep.py"), *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids, left_behind = [], []
    try:
        deadline = time.time() + 120
        while not all(any(e["event"] == "train" for e in events_of(run.dir)) for run in runs):
            assert time.time() < deadline and process.poll() is None, "the runs did not start"
            time.sleep(0.2)
        pids = [int(open(os.path.join(run.dir, "run.lock")).read().split()[0]) for run in runs]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        for pid in pids:  # a train.py still running after sweep.py exited: end it, and fail below
            try:
                os.kill(pid, signal.SIGKILL)
                left_behind.append(pid)
            except ProcessLookupError:
                pass
    assert not left_behind, f"train.py {left_behind} still running after sweep.py exited"
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and err.count("\n") == 1
    for run in runs:
        assert lab.runs.exit_code(run) == 130 and os.path.exists(os.path.join(run.dir, "ckpt.pt"))
        assert files.held_by(run.dir) is None
        assert "--resume" in sweep.train_flags(run, sweep.parse_args(argv))


def test_a_summary_that_cannot_be_written_is_one_line_and_keeps_the_old_one(corpus, tmp_path, monkeypatch, capsys):
    """Disk full at summary.json (then at summary.csv): one line naming the file, exit code 1, the previous summary
    as it was and no temporary file left."""
    argv, runs = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    for run in runs:
        write_log(run.dir, [start, {"event": "done", "step": 4, "val_loss": 2.0}])
        write_config(run, argv)
    assert sweep.main(argv) == 0
    folder = tmp_path / "sweep"
    before = {name: (folder / name).read_bytes() for name in ("summary.json", "summary.csv")}
    for name in before:
        capsys.readouterr()
        with monkeypatch.context() as patch:
            FailingWrites(patch, errno.ENOSPC, name)
            assert sweep.main(argv) == 1
        err = capsys.readouterr().err
        assert err == f"sweep.py: cannot write {folder / name} (No space left on device)\n"
        assert {n: (folder / n).read_bytes() for n in before} == before
        assert not [p for p in folder.iterdir() if ".tmp" in p.name]


def finished_as(run, argv, drop=()):
    """A finished run folder as train.py leaves it, trained with the flags of sweep argv: its log and config.json
    (write_config)."""
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    _, tc = resolved_configs(run, argv)
    write_log(run.dir, [start, {"event": "done", "step": tc.max_iters, "val_loss": 2.0}])
    write_config(run, argv, drop)


def test_two_sweeps_summarizing_one_folder_take_turns(tmp_path):
    """A summary is made under the sweep folder's lock (lab/summary.sweep_lock): a second sweep's waits for the
    first's, and then reads it back, so no summary, and no sweep's wall time, is lost."""
    argv = ["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 's'}", *SWEEP_TINY]
    plan = sweep.parse_args(argv)
    [run] = sweep.grid(plan)
    finished_as(run, argv)
    lab.summary.write_summary(plan, [run], wall_s=10.0)
    with open(tmp_path / "s" / "sweep.lock", "a") as held:  # another sweep, making its summary
        fcntl.flock(held, fcntl.LOCK_EX)
        other = threading.Thread(target=lab.summary.write_summary, args=(plan, [run]), kwargs={"wall_s": 5.0})
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive()  # waiting for the lock
    other.join()
    with open(tmp_path / "s" / "summary.json") as f:
        assert json.load(f)["wall_s"] == 15.0


def resolved_configs(run, argv):
    """The run's configs for the flags of sweep argv, as train.py resolves them before it writes config.json, less
    what the machine decides (configs.resolve)."""
    flags = [f for f in sweep.train_flags(run, sweep.parse_args(argv)) if f not in ("--resume", "--overwrite")]
    model_cfg, tc, _, _ = configs.resolve(configs.parse_flags(flags), machine=False)
    return model_cfg, tc


def write_config(run, argv, drop=()):
    """The run's config.json as train.py writes it before its first step, for the flags of sweep argv: the configs
    resolved as train.py resolves them (vocabulary padded from the tokenizer's, paths absolute), dtype and compile
    as a machine made them concrete, and the data's meta.json as prepared now (with the sha256 of its text), less
    the keys in drop (a config.json written before those keys existed)."""
    model_cfg, tc = resolved_configs(run, argv)
    model = dataclasses.asdict(model_cfg)
    training = {**dataclasses.asdict(tc), "dtype": "float32", "compile": False}
    for key in drop:
        model.pop(key, None)
        training.pop(key, None)
    meta = data.load_meta(data.prepare(tc.dataset, tc.tokenizer, tc.data_dir))
    with open(os.path.join(run.dir, "config.json"), "w") as f:
        json.dump({"model": model, "train": training, "world_size": 1, "data": meta}, f)


def test_a_rerun_with_other_flags_is_refused_naming_the_run_and_the_setting(corpus, tmp_path, capsys):
    """Runs trained with 2 layers and 6 steps are not the runs of a command asking for 3 layers and 9 steps: one
    line naming the run and the first differing setting, exit code 2, nothing written; the same command again
    (whose resolved configs match, with the keys train.py resolves at the start) takes them as finished."""
    argv = last_of_each(["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 'sweep'}", *SWEEP_TINY,
                         "--n_layer=2", "--max_iters=6", f"--dataset={corpus}", f"--data_dir={prepared(corpus)}"])
    [run] = sweep.grid(sweep.parse_args(argv))
    finished_as(run, argv, drop=("z_loss",))  # an older config.json: z_loss counts as its default
    assert sweep.main([*argv, "--dry_run"]) == 0
    assert capsys.readouterr().out == ""  # finished: nothing to run
    before = sorted(os.listdir(tmp_path / "sweep"))
    for other, setting in ((["--n_layer=3", "--max_iters=9"], "n_layer"), (["--z_loss=1e-4"], "z_loss"),
                           (["--dataset=shakespeare"], "dataset")):
        assert sweep.main([*without(argv, other), *other]) == 2
        err = capsys.readouterr().err
        assert err.startswith("sweep.py: ") and err.count("\n") == 1, err
        assert run.dir in err and f"--{setting}" in err and "--out_dir" in err
        assert sorted(os.listdir(tmp_path / "sweep")) == before


def refused_without_config(argv, run, capsys):
    assert sweep.main([*argv, "--dry_run"]) == 2
    assert capsys.readouterr().err == (f"sweep.py: {run.dir} has a result or a checkpoint but no config.json, so "
                                       "nothing says which flags trained it; remove the run (its folder, .exit and "
                                       ".out) to run it again\n")


def test_a_finished_or_resumable_run_without_its_config_json_is_refused(corpus, tmp_path, capsys):
    """train.py writes config.json before the first step: a result or checkpoint without one (deleted, or copied in
    from elsewhere) says nothing of the flags that made it, so a re-run sweep refuses to publish or resume it."""
    argv, (finished, resumable) = two_runs(tmp_path, corpus)
    finished_as(finished, argv)
    config = os.path.join(finished.dir, "config.json")
    with open(config, "rb") as f:
        saved = f.read()
    os.remove(config)
    refused_without_config(argv, finished, capsys)
    with open(config, "wb") as f:  # whole again; now the other run has a checkpoint and nothing else
        f.write(saved)
    os.makedirs(resumable.dir)
    open(os.path.join(resumable.dir, "ckpt.pt"), "wb").close()
    refused_without_config(argv, resumable, capsys)
    assert not os.path.exists(os.path.join(tmp_path, "sweep", "summary.json"))


def test_a_recipe_rerun_over_runs_of_other_flags_is_refused(corpus, tmp_path, capsys):
    """60-step runs of a recipe on another corpus are not the plain recipe command's runs: refused before any
    summary (and so the results page) pairs the recipe's flags with them."""
    out = f"--out_dir={tmp_path / 'r'}"
    tiny = ["--recipe=powernorm", out, "--max_iters=60", f"--dataset={corpus}", f"--data_dir={prepared(corpus)}"]
    for run in sweep.grid(sweep.parse_args(tiny)):
        finished_as(run, tiny)
    assert sweep.main([*tiny, "--dry_run"]) == 0
    capsys.readouterr()
    assert sweep.main(["--recipe=powernorm", out]) == 2
    err = capsys.readouterr().err
    assert "--dataset=" in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "r" / "summary.json")


def test_a_run_killed_by_a_signal_is_unfinished_and_the_stop_message_says_what_is_true(corpus, tmp_path, capsys,
                                                                                        monkeypatch):
    """A run killed by a signal (the OOM killer, kill -9, a Ctrl-C while train.py imports) has a negative exit code
    in its .exit: unfinished, resumed where it has a checkpoint and started afresh where not, never refused; a
    stopped sweep says which of its runs resume and which start again, not that all have a checkpoint."""
    argv, (killed, resumable) = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    write_log(killed.dir, [start])
    finished_as(resumable, argv)
    with open(os.path.join(resumable.dir, "log.jsonl"), "w") as f:
        f.write(json.dumps(start) + "\n")
    open(os.path.join(resumable.dir, "ckpt.pt"), "wb").close()
    for run, code in ((killed, -9), (resumable, -2)):
        with open(run.dir + ".exit", "w") as f:
            f.write(f"{code}\n")
    assert lab.runs.exit_code(killed) == -9 and not lab.runs.is_finished(killed)
    assert lab.summary.run_record(killed)["status"] == "unfinished"
    assert sweep.main([*argv, "--dry_run"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert f"--out_dir={killed.dir} --overwrite" in first and f"--out_dir={resumable.dir} --resume" in second
    monkeypatch.setattr(sweep.pool, "run_all", lambda *args: signal.SIGTERM)  # stopped before any run wrote more
    assert sweep.main(argv) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 resume from a checkpoint, 1 start afresh" in err, err


# --help of sweep.py and plot.py, as a user runs them

@pytest.mark.slow
@pytest.mark.parametrize("script", ["sweep.py", "plot.py"])
def test_sweep_and_plot_help(script):
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--out" in done.stdout and not done.stderr


# A summary is one experiment: one corpus, every run's end read from its log and checkpoint, failed runs counted

def test_a_corpus_edited_between_two_sweep_invocations_is_refused(corpus, tmp_path, capsys):
    """Runs trained on a corpus that was edited since are another experiment's: one line naming the run and the two
    texts, exit code 2, nothing written; with the text put back they are this command's again. A config.json that
    records no sha256 of its data is refused too."""
    text = tmp_path / "corpus.txt"
    text.write_text(open(corpus).read())
    argv, (first, second) = two_runs(tmp_path, str(text))
    for run in (first, second):
        finished_as(run, argv)
    assert sweep.main([*argv, "--dry_run"]) == 0 and capsys.readouterr().out == ""
    before = folder_files(tmp_path / "sweep")
    text.write_text(open(corpus).read() + "\nnorm layer gamma")
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sweep.py: {first.dir} was trained on another text of --dataset={text}") and \
        err.count("\n") == 1, err
    assert folder_files(tmp_path / "sweep") == before  # no summary.json
    text.write_text(open(corpus).read())
    assert sweep.main([*argv, "--dry_run"]) == 0
    config = json.loads(open(os.path.join(second.dir, "config.json")).read())
    del config["data"]["source"]["sha256"]
    with open(os.path.join(second.dir, "config.json"), "w") as f:
        json.dump(config, f)
    capsys.readouterr()
    assert sweep.main([*argv, "--dry_run"]) == 2
    assert capsys.readouterr().err == (f"sweep.py: {second.dir}/config.json records no sha256 of its data, so nothing "
                                       "says which text trained it; remove the run (its folder, .exit and .out) to "
                                       "run it again\n")


def folder_files(root):
    return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def stopped_before_done(run, argv, checkpoint_step):
    """A run as train.py leaves it when stopped after its final evaluation's line (step max_iters) and the checkpoint
    of checkpoint_step, before its "done" line; a resume of it was refused (exit code 2 in its .exit)."""
    finished_as(run, argv)
    _, tc = resolved_configs(run, argv)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    final = {"event": "eval", "step": tc.max_iters, "train_loss": 2.1, "val_loss": 2.0, "lr": 0.0, "rank_spread": 0.0}
    os.remove(os.path.join(run.dir, "log.jsonl"))
    with open(os.path.join(run.dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in (start, final))
    for name in ("ckpt.pt", f"ckpt-{checkpoint_step}.pt"):
        open(os.path.join(run.dir, name), "wb").close()
    with open(run.dir + ".exit", "w") as f:
        f.write("2\n")
    return tc


def test_a_run_stopped_between_its_final_checkpoint_and_its_done_line_is_finished(corpus, tmp_path, capsys):
    """Final evaluation logged and checkpoint at max_iters, no "done" line (a resume of it is refused as past
    max_iters): finished and counted with its final loss, never resumed; with its newest checkpoint before max_iters
    it resumes (training to max_iters logs its end)."""
    argv, (finished, resumable) = two_runs(tmp_path, corpus)
    tc = stopped_before_done(finished, argv, checkpoint_step=4)
    assert tc.max_iters == 4
    stopped_before_done(resumable, argv, checkpoint_step=2)
    assert lab.runs.is_finished(finished) and not lab.runs.is_finished(resumable)
    record = lab.summary.run_record(finished)
    assert (record["status"], record["final_loss"]) == ("done", 2.0)
    assert lab.summary.run_record(resumable)["status"] == "unfinished"
    assert sweep.main([*argv, "--dry_run"]) == 0
    [command] = capsys.readouterr().out.splitlines()
    assert command.endswith(f"--out_dir={resumable.dir} --resume")
    # its checkpoint at max_iters without the final evaluation's line (a stop during that evaluation): no final loss
    with open(os.path.join(finished.dir, "log.jsonl")) as f:
        first_line = f.readline()
    with open(os.path.join(finished.dir, "log.jsonl"), "w") as f:
        f.write(first_line)
    assert not lab.runs.is_finished(finished)


@pytest.mark.parametrize("event, says", [
    ({k: v for k, v in diverged(3, 0.01, "fc2", 0).items() if k != "steps_survived"},
     "diverged event: steps_survived is missing"),
    ({**diverged(3, 0.01, "fc2", 0), "lr": None}, "diverged event: lr is null, not a number"),
    ({k: v for k, v in diverged(3, 0.01, "fc2", 0).items() if k != "reason"}, "diverged event: reason is missing"),
    ({**diverged(3, 0.01, "fc2", 0), "failed_op": {"layer": 0}}, "diverged event: failed_op.op is missing"),
    ({**diverged(3, 0.01, "fc2", 0), "grew_most": {"op": "fc2", "layer": 0}},
     "diverged event: grew_most.ratio is missing"),
    ({"event": "eval", "step": 3, "val_loss": 2.0, "lr": "0.01"}, "eval event: lr is a string, not a number"),
    ({"event": "train", "step": 3, "loss": 2.0}, "train event: lr is missing"),
    ({"event": "telemetry", "step": 3, "weights": [{"layer": 0, "op": "fc2", "name": "w", "grad_mean_abs": 1.0}],
      "attn_logit_max": [], "logits": {"mean_log_z": 0.1}}, "telemetry event: weights[0].grad_l2 is missing"),
    ({"event": "telemetry", "step": 3, "weights": [], "attn_logit_max": [{"layer": 0}], "logits": {"mean_log_z": 0.1}},
     "telemetry event: attn_logit_max[0].value is missing"),
    ({"event": "telemetry", "step": 3, "weights": [], "attn_logit_max": [], "logits": {}},
     "telemetry event: logits.mean_log_z is missing"),
])
def test_every_event_field_the_summary_reads_is_checked(corpus, tmp_path, capsys, event, says):
    """A finished sweep whose log has an event without a field the summary reads (a diverged event without
    steps_survived was a KeyError): one line naming the file, line and field, exit code 2, nothing written."""
    argv, runs = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    for run in runs:
        finished_as(run, argv)
    end = [] if event["event"] == "diverged" else [{"event": "done", "step": 4, "val_loss": 2.0}]
    with open(os.path.join(runs[1].dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in (start, event, *end))
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"sweep.py: {runs[1].dir}/log.jsonl:2: {says}; it is not a log nanonorm wrote\n"
    assert not os.path.exists(tmp_path / "sweep" / "summary.json")


def fail_every_run(runs, jobs, command):
    """pool.run_all where every run crashes at once (train.py's exit code 1)."""
    for run in runs:
        os.makedirs(os.path.dirname(run.dir), exist_ok=True)
        with open(run.dir + ".exit", "w") as f:
            f.write("1\n")


def test_a_sweep_whose_runs_fail_exits_4_with_a_count_and_a_recipe_publishes_no_verdict(corpus, tmp_path, capsys,
                                                                                           monkeypatch):
    """Every run crashes: exit code 4, one line counting them, and a summary that says so (failed_runs, no_verdict,
    each claim's verdict), not "not run yet". With some runs finished and one crashed the recipe still publishes no
    verdict; a diverged run is a result, not a failure."""
    monkeypatch.setattr(sweep.pool, "run_all", fail_every_run)
    argv = ["--recipe=powernorm", f"--out_dir={tmp_path / 'r'}", "--max_iters=4", "--warmup_iters=0",
            f"--dataset={corpus}", f"--data_dir={prepared(corpus)}"]
    runs = sweep.grid(sweep.parse_args(argv))
    assert sweep.main(argv) == sweep.RUNS_FAILED == 4
    err = capsys.readouterr().err
    assert err == (f"sweep.py: {len(runs)} of {len(runs)} runs failed (they crashed or were refused: see their .out "
                   "files); the recipe publishes no verdict; exit code 4\n")
    with open(tmp_path / "r" / "summary.json") as f:
        summary = json.load(f)
    why = f"all {len(runs)} runs failed: they crashed or were refused, see their .out files"
    assert (summary["failed_runs"], summary["no_verdict"]) == (len(runs), why)
    assert summary["claims"] and all(c["verdict"] == f"no verdict ({why})" for c in summary["claims"])

    *others, crashed = runs
    for run in others:
        os.remove(run.dir + ".exit")
        finished_as(run, argv)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    with open(os.path.join(others[0].dir, "log.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in (start, diverged(3, 0.01, "fc2", 0)))
    assert sweep.main(argv) == 4
    assert capsys.readouterr().err.startswith(f"sweep.py: 1 of {len(runs)} runs failed")
    with open(tmp_path / "r" / "summary.json") as f:
        summary = json.load(f)
    why = f"1 of {len(runs)} runs failed: they crashed or were refused, see their .out files"
    assert (summary["failed_runs"], summary["no_verdict"]) == (1, why)
    assert all(c["verdict"] == f"no verdict ({why})" for c in summary["claims"])

    os.remove(crashed.dir + ".exit")
    finished_as(crashed, argv)
    assert sweep.main(argv) == 0  # every run finished, one of them diverged: a verdict
    with open(tmp_path / "r" / "summary.json") as f:
        summary = json.load(f)
    assert (summary["failed_runs"], summary["no_verdict"]) == (0, None)
    assert not any(c["verdict"].startswith("no verdict") for c in summary["claims"])
    assert [r["status"] for r in summary["runs"]].count("diverged") == 1


def test_unpaired_binary_rows_use_fishers_exact_test():
    """survived@LR, a recipe's binary endpoint, where the sides ran different seeds: Fisher's exact test of 4 of 4
    against 0 of 4 survivors, by hand p = 2 / C(8, 4) (the two tables as unlikely as the observed, each 1 / 70); the
    margins allow nothing smaller. A run that diverged did not survive."""
    claims = [lab.recipes.Claim("v", "survived@1e-2", "better", "", 1.0, "nanonorm's choice", "nanonorm")]
    records = [record("v", "1e-2", s, "done", final_loss=2.0) for s in range(4)]
    records += [record("ref", "1e-2", s, "diverged", final_loss=math.inf) for s in range(4, 8)]  # other seeds
    [row] = [r for r in lab.summary.comparisons(records, "lr", ["1e-2"], ["ref", "v"], "ref", claims)
             if r["metric"] == "survived@1e-2"]
    assert (row["test"], row["p_exact"], row["shares"], row["observed"]) == ("Fisher's exact", "1/35", [1.0, 0.0],
                                                                             "better")
    assert row["p"] == row["smallest_p"] == pytest.approx(2 / math.comb(8, 4)) and row["verdict"] == "agrees"
    # 3 of 4 against 1 of 4: the tables 3-1, 1-3, 4-0 and 0-4 are each no more likely than 3-1 (16/70 each, 1/70)
    result = lab.summary.unpaired_binary([1, 1, 1, 0], [1, 0, 0, 0], "higher", "better")
    assert result["p_exact"] == "17/35" and result["verdict"].startswith("not detected")


def nan_at_init(run_dir):
    """A run whose loss at initialization is NaN, as an init that overflows gives: its eval and its divergence."""
    write_log(run_dir, [{"event": "eval", "step": 0, "train_loss": math.nan, "val_loss": math.nan, "lr": 0.01,
                         "rank_spread": 0.0},
                        {**diverged(0, 0.01, "fc2", 0), "reason": "non-finite validation loss (nan)",
                         "failed_op": None, "criterion": "non-finite val loss"}])


def test_a_nan_loss_at_initialization_yields_a_summary_on_every_rerun(corpus, tmp_path, capsys):
    """A variant whose every run has a NaN loss at initialization (its logs written here, as an init that overflows
    would leave them; --init_std itself is bounded): failed runs at ln(V) in its row, as in its comparison with the
    reference, and a summary on every invocation, never a crash."""
    argv = ["--variants=baseline,init=plain+init_std=1", "--lrs=1e-2,1e-3", "--seeds=2", "--reference=baseline",
            f"--out_dir={tmp_path / 'sweep'}", f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", *SWEEP_TINY]
    for run in sweep.grid(sweep.parse_args(argv)):
        if run.variant == "baseline":
            finished_as(run, argv)
        else:
            nan_at_init(run.dir)
            write_config(run, argv)
    for _ in range(2):
        assert sweep.main(argv) == 0
        with open(tmp_path / "sweep" / "summary.json") as f:
            summary = json.load(f)
        row = summary["variants"][1]
        assert (row["L(1e-2)"], row["L(1e-3)"], row["lr_sensitivity"], row["diverged"]) == (LN_V, LN_V, LN_V, 4)
        final = next(c for c in summary["comparisons"] if c["metric"] == "final_loss@1e-2")
        assert final["variant_values"] == {"median": LN_V, "min": LN_V, "max": LN_V, "n": 2}
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("log, code, says", [
    ("done", 3, ".exit records exit code 3 (diverged), but {log} ends in done"),
    ("diverged", 0, ".exit records exit code 0 (done), but {log} ends in diverged"),
    ("removed", 0, ".exit records exit code 0 (done), but {log} is gone"),
    ("folder removed", 0, ".exit records exit code 0 (done), but the run's folder {dir} is gone"),
])
def test_an_exit_code_the_log_does_not_bear_out_is_refused(corpus, tmp_path, capsys, log, code, says):
    """Issue 46: `echo 3 > <run>.exit` beside a log that ends in done made a re-run count the run as diverged, and a
    run whose log.jsonl was removed counted as done with a null final loss. train.py exits 0 or 3 only after logging
    that end: where the two disagree the sweep refuses in one line, exit code 2, and writes nothing."""
    argv, (first, _) = two_runs(tmp_path, corpus)
    start = {"event": "eval", "step": 0, "train_loss": 5.5, "val_loss": 5.6, "lr": 0.0, "rank_spread": 0.0}
    end = {"event": "done", "step": 2, "val_loss": 5.0} if log != "diverged" else diverged(2, 0.01, "fc2", 0)
    write_log(first.dir, [start, end])
    write_config(first, argv)
    with open(first.dir + ".exit", "w") as f:
        f.write(f"{code}\n")
    if log == "removed":
        os.remove(os.path.join(first.dir, "log.jsonl"))
    if log == "folder removed":
        shutil.rmtree(first.dir)
    before = sorted(os.listdir(tmp_path / "sweep"))
    assert sweep.main(argv) == 2
    err = capsys.readouterr().err
    expected = says.format(log=os.path.join(first.dir, "log.jsonl"), dir=first.dir)
    assert err.startswith(f"sweep.py: {first.dir}.exit records") and expected in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path / "sweep")) == before


def test_log_steps_that_go_back_are_refused(tmp_path):
    """Issue 46: a log whose steps go back (two logs pasted, an edit) was kept; it is one line naming the line."""
    path = tmp_path / "log.jsonl"
    lines = [{"event": "eval", "step": 0, "val_loss": 5.0}, {"event": "train", "step": 6, "loss": 4.0, "lr": 0.1},
             {"event": "train", "step": 3, "loss": 4.5, "lr": 0.1}]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    with pytest.raises(flags_error) as error:
        run_reader.read_log(str(path))
    assert str(error.value) == (f"{path}:3: step 3 after step 6; a run's log goes forward in steps, so this is not "
                                "one run's log")
    path.write_text("".join(json.dumps(e) + "\n" for e in sorted(lines, key=lambda e: e["step"])))
    assert [e["step"] for e in run_reader.read_log(str(path))[0]] == [0, 3, 6]


@pytest.mark.parametrize("extra, says", [
    (["--lrs=1e-2", "--lrs=3e-2"], "--lrs is given twice (--lrs=1e-2, then --lrs=3e-2); give each flag once"),
    (["--z_loss=1e-4", "--z_loss=1e-3"], "--z_loss is given twice (--z_loss=1e-4, then --z_loss=1e-3)"),
    (["--variants=norm=rmsnorm", "--norm=layernorm"], "--norm is set by the variant norm=rmsnorm too; give it in the "
                                                      "variants or on the command line, not both"),
], ids=["sweep flag", "train flag", "a variant's flag"])
def test_a_flag_given_twice_is_refused(corpus, tmp_path, capsys, monkeypatch, extra, says):
    """Issue 46: `sweep.py --lrs=1e-2 --lrs=3e-2` ran only 3e-2; a flag the variant sets as well was the variant's
    without a word. Each is one line before anything runs or is written."""
    monkeypatch.setattr(sweep.pool, "run_all", lambda *args: pytest.fail("a run was started"))
    base = [f"--out_dir={tmp_path / 'sweep'}", f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", *SWEEP_TINY]
    variants = [] if any(e.startswith("--variants") for e in extra) else ["--variants=baseline"]
    lrs = [] if any(e.startswith("--lrs") for e in extra) else ["--lrs=1e-2"]
    assert sweep.main([*variants, *lrs, *base, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep.py: ") and says in err and err.count("\n") == 1, err
    assert not os.path.exists(tmp_path / "sweep")


def test_a_recipes_flag_given_on_the_command_line_replaces_it_once(capsys):
    """The command line's train.py flags replace the recipe's (train.py would refuse one given twice)."""
    name = next(n for n, r in lab.recipes.RECIPES.items() if any(f.startswith("--max_iters=") for f in r.flags))
    assert sweep.main([f"--recipe={name}", "--max_iters=3", "--dry_run"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert commands and all([a for a in c if a.startswith("--max_iters")] == ["--max_iters=3"] for c in commands)


def test_the_same_sweep_started_twice_at_once_refuses_the_second(corpus, tmp_path, capsys, monkeypatch):
    """Issue 46: two copies of one sweep started the same runs, printed "exit 2" lines and both exited 0. The sweep
    holds its folder's lock (sweep.running.lock) for its whole life: a second one is one line, exit code 2, and
    starts nothing. --dry_run, which runs nothing, takes no lock."""
    monkeypatch.setattr(sweep.pool, "run_all", lambda *args: pytest.fail("a run was started"))
    argv, _ = two_runs(tmp_path, corpus)
    os.makedirs(tmp_path / "sweep", exist_ok=True)
    with open(tmp_path / "sweep" / sweep.RUNNING, "a") as held:  # the first sweep, running
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242 elsewhere\n")
        held.flush()
        assert sweep.main([*argv, "--dry_run"]) == 0
        capsys.readouterr()
        assert sweep.main(argv) == 2
        assert capsys.readouterr().err == (f"sweep.py: --out_dir={tmp_path / 'sweep'} is in use by another sweep "
                                           "(PID 4242 on elsewhere); wait for it to end or stop it, or choose another "
                                           "--out_dir\n")


def test_a_train_py_run_folder_is_no_sweep_folder(corpus, tmp_path, capsys):
    """Issue 46: sweep.py took a train.py run's folder as --out_dir and put its runs among the run's files."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"event": "eval", "step": 0, "val_loss": 5.0}\n')
    (run / "config.json").write_text("{}")
    before = sorted(os.listdir(run))
    assert sweep.main(["--variants=baseline", "--lrs=1e-2", f"--out_dir={run}", f"--dataset={corpus}",
                       *SWEEP_TINY, "--dry_run"]) == 2
    assert capsys.readouterr().err == (f"sweep.py: --out_dir={run} is a train.py run's folder (it holds config.json, "
                                       "log.jsonl); give the sweep a folder of its own\n")
    assert sorted(os.listdir(run)) == before


@pytest.mark.parametrize("mode", [[], ["--resume"], ["--overwrite"]], ids=["fresh", "resume", "overwrite"])
@pytest.mark.parametrize("name", run_reader.SWEEP_FILES)
def test_a_sweep_folder_is_no_run_folder(corpus, tmp_path, capsys, name, mode):
    """Issue 55: train.py --out_dir=SW, while a sweep ran in SW, trained there (exit 0) beside its summary.json and
    sweep.lock, and the sweep then refused its own folder. Refused whatever the mode, nothing written."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / name).write_text("")
    assert train.main(train_argv(corpus, prepared(corpus), str(folder), *TINY, "--max_iters=2", *mode)) == 2
    assert capsys.readouterr().err == (f"train.py: --out_dir={folder} is a sweep's folder (it holds {name}); a run "
                                       "needs a folder of its own: choose another --out_dir (a sweep's runs are in "
                                       "its <variant>/<lr>/<seed> folders)\n")
    assert os.listdir(folder) == [name]


@pytest.mark.slow
def test_a_run_into_a_running_sweeps_folder_is_refused_and_the_sweep_keeps_its_folder(corpus, tmp_path, capsys):
    """Issue 55's case itself: train.py --out_dir=SW while sweep.py --out_dir=SW runs. The sweep's own files (every
    file it leaves at the top of its folder) are what run_reader.SWEEP_FILES names."""
    folder = tmp_path / "sweep"
    argv = ["--variants=baseline", "--lrs=1e-2", f"--out_dir={folder}", f"--dataset={corpus}",
            f"--data_dir={prepared(corpus)}", *SWEEP_TINY]
    running = subprocess.Popen([sys.executable, "sweep.py", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while not (folder / sweep.RUNNING).exists() and time.time() < deadline and running.poll() is None:
            time.sleep(0.05)
        assert (folder / sweep.RUNNING).exists(), running.poll()
        assert train.main(train_argv(corpus, prepared(corpus), str(folder), *TINY, "--max_iters=2")) == 2
        assert "is a sweep's folder (it holds sweep.running.lock" in capsys.readouterr().err
        output = running.communicate(timeout=900)[0]
    finally:
        running.kill()
    assert running.returncode == 0, output
    assert sweep.main(argv) == 0  # the same command again: its folder is still its own
    assert {p.name for p in folder.iterdir() if p.is_file()} <= set(run_reader.SWEEP_FILES)


@pytest.mark.parametrize("carried, says", [
    ({"machine": "oops"}, "machine is a string, not an object"),
    ({"wall_s": math.nan}, "wall_s is NaN, not a finite number of seconds >= 0"),
])
def test_a_rerun_does_not_carry_a_meaningless_field_forward(tmp_path, carried, says):
    """Issue 46: `machine='oops'` and a NaN wall_s survived a re-run, which carries both over; the re-run refuses the
    summary in one line (it is left as it is) and says how to rebuild it."""
    path = tmp_path / "summary.json"
    text = json.dumps({"mode": "lr", "wall_s": 12.0, "machine": {"hardware": "cpu", "load": 1.0, "torch": "2",
                                                                  "date": "2026-11-24"}, **carried})
    path.write_text(text)
    with pytest.raises(flags_error) as error:
        lab.summary.previous_summary(str(tmp_path))
    assert str(error.value) == f"{path}: {says}; {lab.summary.REBUILD}"
    assert path.read_text() == text


def test_a_recipes_tested_seeds_run_only_the_lrs_its_pilot_chose(monkeypatch):
    # normformer_loss: the pilot seeds 100-102 run every LR; after them each arm only at the LRs the design names
    monkeypatch.setattr(recipes.RECIPES["normformer_loss"], "tested_lrs", {"nf_baseline": ["1.2e-2"],
                                                                           "nf_normformer": ["6e-3", "1.2e-2"]})
    runs = sweep.grid(sweep.parse_args(["--recipe=normformer_loss"]))
    tested = {(run.variant, run.lr) for run in runs if run.seed >= 103}
    assert tested == {("nf_baseline", "1.2e-2"), ("nf_normformer", "6e-3"), ("nf_normformer", "1.2e-2")}
    assert len([run for run in runs if run.seed < 103]) == 2 * 4 * 3
    assert len(runs) == 2 * 4 * 3 + 3 * recipes.RECIPES["normformer_loss"].tested_seeds

"""--tensorboard (engine/tensorboard_view.py): the event files, read back with TensorBoard's own reader, hold
log.jsonl's steps and values, each step once after a resume; a sweep's runs are one tree of variant/LR/seed;
TensorBoard itself serves them; and nanonorm without tensorboard installed trains, and refuses --tensorboard in one
line."""

import contextlib
import errno
import glob
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from diagnostics import probes
from engine import files
import plot
import sweep
from conftest import ROOT, SWEEP_TINY, events, prepared, run, tiny, torchrun, train_argv

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import event_multiplexer
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2
from torch.utils.tensorboard import SummaryWriter

EVERYTHING = {event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}  # keep every point, sample none


def accumulator(out_dir):
    acc = event_accumulator.EventAccumulator(str(out_dir), size_guidance=EVERYTHING)
    acc.Reload()
    return acc


def curve(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def as_stored(value):
    """A logged number as an event file's scalar holds it: float32 (True as 1.0)."""
    return float(np.float32(value))


def top_level_scalars(log):
    """{tag: [(step, value)]} of the numbers at the top of each log line: tag <event>/<key>."""
    expected = {}
    for e in log:
        for key, value in e.items():
            if key not in ("event", "step") and isinstance(value, (bool, int, float)):
                expected.setdefault(f"{e['event']}/{key}", []).append((e["step"], as_stored(value)))
    return expected


def texts(acc, kind):
    """The log lines shown as text under an event's name: [(step, event)]."""
    return [(e.step, json.loads(e.tensor_proto.string_val[0].decode())) for e in acc.Tensors(f"{kind}/text_summary")]


@pytest.fixture(scope="module")
def watched(corpus, tmp_path_factory):
    """A tiny run with --tensorboard, telemetry and headroom every 2 steps, and every step with finite z-scores a
    spike, skipped (a tiny run's loss falls too steadily to spike)."""
    folder = tmp_path_factory.mktemp("watched")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probes.SpikeMonitor, "is_spike", lambda self, z_loss, z_grad: math.isfinite(z_loss + z_grad))
        assert run(corpus, folder, *tiny(max_iters=4, eval_interval=2), "--tensorboard", "--telemetry_interval=2",
                   "--fp16_headroom_interval=2", "--attn_impl=manual", "--spike_window=2", "--skip_spikes") == 0
    return folder / "out"


@pytest.fixture(scope="module")
def diverged(corpus, tmp_path_factory):
    """A tiny run with --tensorboard that --fp16_overflow_fails ends in its first step, with float16's largest value
    taken as 3 (a LayerNorm's output of width 32 reaches about 3.7)."""
    folder = tmp_path_factory.mktemp("diverged")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(probes, "FP16_MAX", 3.0)
        assert run(corpus, folder, *tiny(max_iters=4), "--tensorboard", "--fp16_overflow_fails") == 3
    return folder / "out"


def assert_shows_the_log(out_dir):
    """Every number at the top of each log line is a scalar <event>/<key> with its steps and values, and there is no
    other such scalar; every event but train, eval, telemetry and headroom is text at its step, its log line."""
    log, acc = events(out_dir), accumulator(out_dir)
    expected = top_level_scalars(log)
    for tag, points in expected.items():
        assert curve(acc, tag) == points, tag
    assert {t for t in acc.Tags()["scalars"] if "." not in t.split("/")[0]} == set(expected)
    shown = {e["event"] for e in log} - {"train", "eval", "telemetry", "headroom"}
    for kind in shown:
        assert texts(acc, kind) == [(e["step"], e) for e in log if e["event"] == kind]
    assert {t for t in acc.Tags()["tensors"] if t.endswith("/text_summary")} == {f"{k}/text_summary" for k in shown}
    return log, acc


def test_event_files_hold_the_logged_steps_and_values_of_log_jsonl(watched):
    log, _ = assert_shows_the_log(watched)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/val_loss", "eval/train_loss",
            "spike/z_loss_score", "spike/skipped", "done/val_loss"} <= set(top_level_scalars(log))
    assert [e["step"] for e in log if e["event"] == "spike" and e["skipped"]] == [3, 4]


def test_a_divergence_shows_its_first_overflowing_op(diverged):
    log, acc = assert_shows_the_log(diverged)
    [end] = [e for e in log if e["event"] == "diverged"]
    assert end["step"] == 0 and end["failed_op"]["op"] == "attn_ln"
    assert curve(acc, "diverged.failed_op/max_abs") == [(0, as_stored(end["failed_op"]["max_abs"]))]


def test_per_layer_figures_are_one_tag_per_layer_and_one_chart_per_figure(watched):
    log, acc = events(watched), accumulator(watched)
    telemetry = [e for e in log if e["event"] == "telemetry"]
    headroom = [e for e in log if e["event"] == "headroom"]
    assert telemetry and headroom
    layers = sorted({row["layer"] for row in telemetry[0]["acts"] if row["layer"] is not None})
    assert layers == [0, 1]
    for layer in layers:
        assert curve(acc, f"telemetry.acts.std/fc2/layer_{layer}") == [
            (e["step"], as_stored(row["std"])) for e in telemetry for row in e["acts"]
            if (row["op"], row["layer"]) == ("fc2", layer)]
        assert curve(acc, f"telemetry.attn_logit_max.value/layer_{layer}") == [
            (e["step"], as_stored(row["value"])) for e in telemetry for row in e["attn_logit_max"]
            if row["layer"] == layer]
        assert curve(acc, f"headroom.ops.max_abs/q@k:backward/layer_{layer}") == [
            (e["step"], as_stored(row["max_abs"])) for e in headroom for row in e["ops"]
            if (row["op"], row["pass"], row["layer"]) == ("q@k", "backward", layer)]
    assert curve(acc, "telemetry.logits/mean_log_z") == [(e["step"], as_stored(e["logits"]["mean_log_z"]))
                                                         for e in telemetry]
    # every number of a telemetry event has a tag of its own: a row's parameter tells fused q, k, v and W from b
    scalars = acc.Tags()["scalars"]
    weights = [t for t in scalars if t.startswith("telemetry.weights.grad_l2/")]
    rows = [row for row in telemetry[0]["weights"]]
    assert len(weights) == len(rows)
    # the custom-scalars layout: one chart per figure, drawing every layer and no other figure
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {chart.title: chart.multiline.tag for category in layout.category for chart in category.chart}
    assert {"telemetry.acts.std/fc2", "telemetry.acts.std/q", "telemetry.acts.std/q@k"} <= set(charts)
    for title, [pattern] in charts.items():  # the chart of q draws q's layers, not those of q@k
        assert sorted(t for t in scalars if re.search(pattern, t)) == [f"{title}/layer_{i}" for i in layers], title


def test_a_view_that_cannot_be_written_ends_with_a_note_and_the_run_goes_on(corpus, tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SummaryWriter, "add_scalar", full)
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--tensorboard") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "--tensorboard" in line]
    assert notes == [f"train.py: note: --tensorboard: cannot write the event files in {tmp_path / 'out'} (No space "
                     "left on device); the view ends at step 0, log.jsonl holds every event"]
    assert [e["step"] for e in events(tmp_path / "out", "train")] == [1, 2]
    # an event file of an earlier start that cannot be removed (a folder in its place): no new view, the same note
    monkeypatch.undo()
    (tmp_path / "out" / "events.out.tfevents.0.host.1.0.nanonorm").mkdir()
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--tensorboard", "--overwrite") == 0
    [note] = [line for line in capsys.readouterr().err.splitlines() if "--tensorboard" in line]
    assert note.endswith("the view ends before it began, log.jsonl holds every event")
    assert glob.glob(str(tmp_path / "out" / "events.out.tfevents.*")) == [
        str(tmp_path / "out" / "events.out.tfevents.0.host.1.0.nanonorm")]


def test_plot_writes_a_finished_runs_view_as_train_would_have(corpus, tmp_path, monkeypatch, capsys):
    """A run without --tensorboard, viewed afterwards: plot.py --tensorboard writes the event files train.py's
    --tensorboard would have (every number and event of log.jsonl), draws no picture, and a second time replaces its
    view rather than adding one."""
    monkeypatch.chdir(tmp_path)
    assert run(corpus, tmp_path, *tiny(max_iters=4, eval_interval=2), "--telemetry_interval=2",
               "--fp16_headroom_interval=2") == 0
    out = tmp_path / "out"
    assert not glob.glob(str(out / "events.out.tfevents.*"))
    capsys.readouterr()
    for _ in range(2):
        assert plot.main([str(out), "--tensorboard"]) == 0
        assert len(glob.glob(str(out / "events.out.tfevents.*.nanonorm"))) == 1
    _, acc = assert_shows_the_log(out)
    assert any(tag.startswith("telemetry.") for tag in acc.Tags()["scalars"])
    assert any(tag.startswith("headroom.") for tag in acc.Tags()["scalars"])
    said = capsys.readouterr().out
    assert said.splitlines()[-1] == (f"plot.py: the TensorBoard view of 1 run written beside its log.jsonl: "
                                     f"tensorboard --logdir={tmp_path}")  # the folder above: its run is "out"
    assert not (tmp_path / "plots").exists()


def test_plot_writes_a_view_whole_or_not_at_all(corpus, tmp_path):
    """A view plot.py cannot write whole (`ulimit -f 4`: TensorBoard's writer thread meets EFBIG): one line naming
    the event file, exit code 1, no traceback; the view written before is left as it was and no part of the new one
    is; an event file of a rebuild killed on the way (*.nanonorm.tmp) is removed by the next one."""
    assert run(corpus, tmp_path, *tiny(max_iters=8), "--telemetry_interval=2") == 0
    out = tmp_path / "out"
    argv = [sys.executable, "plot.py", str(out), "--tensorboard"]
    assert subprocess.run(argv, cwd=ROOT, capture_output=True).returncode == 0
    [view] = glob.glob(str(out / "events.out.tfevents.*"))
    before = open(view, "rb").read()
    assert len(before) > 4096
    (out / "events.out.tfevents.1.host.2.0.nanonorm.tmp").write_bytes(before[:100])

    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, preexec_fn=limit)
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(rf"plot\.py: cannot write {re.escape(str(out))}/events\.out\.tfevents\.\S+\.nanonorm "
                        r"\(File too large\)\n", done.stderr), done.stderr
    assert glob.glob(str(out / "events.out.tfevents.*")) == [view]
    assert open(view, "rb").read() == before


def test_plot_refuses_to_view_a_run_still_training_and_views_with_pictures_or_the_page(corpus, tmp_path, capsys):
    assert run(corpus, tmp_path, *tiny(max_iters=2)) == 0
    out = tmp_path / "out"
    lock = files.claim(str(out))  # as a training process holds it
    try:
        assert plot.main([str(out), "--tensorboard"]) == 2
    finally:
        lock.close()
    err = capsys.readouterr().err
    assert err.startswith(f"plot.py: {out} is in use by a run (PID {os.getpid()}") and err.count("\n") == 1
    assert not glob.glob(str(out / "events.out.tfevents.*"))
    for argv in ([str(out), "--tensorboard", f"--out={tmp_path / 'pictures'}"],
                 ["--tensorboard", f"--experiments={tmp_path}"]):
        assert plot.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("plot.py: --tensorboard ") and err.count("\n") == 1


def scalar_points(out_dir):
    """[(tag, step)] of every scalar in every event file of out_dir, read raw (no purge, no sampling)."""
    points = []
    for path in sorted(glob.glob(os.path.join(out_dir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            points += [(value.tag, event.step) for value in event.summary.value
                       if value.metadata.plugin_data.plugin_name == "scalars"]
    return points


@pytest.mark.slow
def test_a_resumed_run_has_each_step_once(corpus, tmp_path):
    """A run logs steps 1-4, then resumes from its checkpoint at step 2 (the one of step 4 lost): the event files,
    read raw, hold steps 3 and 4 once, with log.jsonl's values; a fresh run without --tensorboard in the folder
    removes the view of the run it replaces, and no file of another writer."""
    flags = [*tiny(max_iters=4, eval_interval=2), "--keep_checkpoints=2"]
    assert run(corpus, tmp_path, *flags, "--tensorboard") == 0
    out = tmp_path / "out"
    for name in ("ckpt.pt", "ckpt-4.pt"):
        os.remove(out / name)
    assert run(corpus, tmp_path, *flags, "--resume") == 0  # --tensorboard from the checkpoint
    points = scalar_points(out)
    assert len(points) == len(set(points))
    assert sorted(step for tag, step in points if tag == "train/loss") == [1, 2, 3, 4]
    acc = accumulator(out)
    for tag, expected in top_level_scalars(events(out)).items():
        assert curve(acc, tag) == expected, tag

    foreign = out / "events.out.tfevents.1.elsewhere"
    foreign.write_bytes(b"")
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--overwrite") == 0
    assert glob.glob(str(out / "events.out.tfevents.*")) == [str(foreign)]


@pytest.mark.slow
def test_only_process_0_writes(corpus, tmp_path):
    result = torchrun(2, *train_argv(corpus, prepared(corpus), tmp_path / "out", *tiny(max_iters=2), "--tensorboard"))
    assert result.returncode == 0, result.stderr[-2000:]
    [path] = glob.glob(str(tmp_path / "out" / "events.out.tfevents.*"))
    assert [step for step, _ in curve(accumulator(tmp_path / "out"), "train/loss")] == [1, 2]


def sweep_argv(out, corpus):
    """A sweep of 2 variants x 2 LRs x 2 seeds."""
    return ["--variants=baseline,norm=rmsnorm", "--lrs=1e-3,1e-2", "--seeds=2", "--jobs=2", f"--out_dir={out}",
            f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", *SWEEP_TINY]


@pytest.fixture(scope="module")
def sweep_tree(corpus, tmp_path_factory):
    """sweep_argv's sweep with --tensorboard."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    assert sweep.main([*sweep_argv(out, corpus), "--tensorboard"]) == 0
    return out


RUNS = {f"{variant}/{lr}/{seed}" for variant in ("baseline", "norm=rmsnorm") for lr in ("1e-3", "1e-2")
        for seed in (0, 1)}


@pytest.mark.slow
def test_a_sweeps_runs_are_one_tree_of_variant_lr_seed(sweep_tree, corpus, capsys):
    """One TensorBoard run per variant/LR/seed, each with its curves; the same sweep without --tensorboard finds
    its runs finished (watching a run is no setting of it)."""
    runs = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(sweep_tree)).Reload()
    assert set(runs.Runs()) == RUNS
    for name in RUNS:
        assert [step for step, _ in curve(runs.GetAccumulator(name), "train/loss")] == [1, 2, 3, 4]
    # TensorBoard's run filter is a regular expression: ^norm=rmsnorm/ is one arm, /1e-2/ one LR
    assert len([r for r in RUNS if re.search("^norm=rmsnorm/", r)]) == len([r for r in RUNS if "/1e-2/" in r]) == 4
    capsys.readouterr()
    assert sweep.main(sweep_argv(sweep_tree, corpus)) == 0
    assert "8 runs, 8 finished already" in capsys.readouterr().out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def scalars_served(base, run, tag):
    """[(step, value)] of a run's scalar from TensorBoard's HTTP API, or None while it has none."""
    try:
        return [(step, value) for _, step, value in get_json(f"{base}/data/plugin/scalars/scalars?run={run}&tag={tag}")]
    except OSError:  # not listening yet, or no such run or tag yet
        return None


@contextlib.contextmanager
def tensorboard(logdir, log):
    """`tensorboard --logdir=logdir` on a free loopback port, reloading every second: its base URL; stopped at the
    end, by SIGTERM, or SIGKILL after 15 s."""
    port = free_port()
    with open(log, "w") as err:
        server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", f"--logdir={logdir}", "--host=127.0.0.1",
                                   f"--port={port}", "--reload_interval=1"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_for(check, seconds=90):
    deadline = time.time() + seconds
    while time.time() < deadline and not check():
        time.sleep(1)
    return check()


@pytest.mark.slow
def test_tensorboard_serves_every_run_of_a_sweep_and_its_scalar_tags(sweep_tree, tmp_path):
    """`tensorboard --logdir=<sweep folder>` on a free loopback port: its HTTP API lists every run and the scalar
    tags of each; stopped within the test's time bound either way."""
    with tensorboard(sweep_tree, tmp_path / "tensorboard.err") as base:
        runs, tags = [], {}

        def served():
            nonlocal runs, tags
            try:
                runs, tags = get_json(f"{base}/data/runs"), get_json(f"{base}/data/plugin/scalars/tags")
            except OSError:  # not listening yet
                return False
            return set(runs) == RUNS and all("train/loss" in tags.get(r, {}) for r in RUNS)

        wait_for(served)
        assert set(runs) == RUNS, (tmp_path / "tensorboard.err").read_text()[-2000:]
        assert all({"train/loss", "eval/val_loss", "train/lr", "train/grad_norm"} <= set(tags[r]) for r in RUNS)


@pytest.mark.slow
def test_a_tensorboard_watching_a_run_shows_its_resume_in_place(corpus, tmp_path):
    """TensorBoard (its default loader) watches a run of 4 steps from the folder above, which names the run by its
    folder ("." from the run folder itself); the run then resumes from step 2: it serves steps 3 and 4 once, with the
    resumed run's values (its own timing, not the first run's)."""
    flags = [*tiny(max_iters=4, eval_interval=2), "--keep_checkpoints=2", "--tensorboard"]
    assert run(corpus, tmp_path, *flags) == 0
    out = tmp_path / "out"
    with tensorboard(tmp_path, tmp_path / "tensorboard.err") as base:  # the folder above: the run is named "out"
        def served(log):
            return scalars_served(base, "out", "train/ms_per_step") == [
                (e["step"], as_stored(e["ms_per_step"])) for e in log if e["event"] == "train"]

        first = events(out)
        assert wait_for(lambda: served(first)), (tmp_path / "tensorboard.err").read_text()[-2000:]
        for name in ("ckpt.pt", "ckpt-4.pt"):
            os.remove(out / name)
        assert run(corpus, tmp_path, *flags, "--resume") == 0
        resumed = events(out)
        assert resumed != first
        assert wait_for(lambda: served(resumed))


@pytest.mark.slow
def test_without_tensorboard_installed_train_runs_and_tensorboard_is_one_line(corpus, tmp_path):
    """A tensorboard that cannot be imported (a package of that name that raises ImportError, first on the path):
    train.py trains without --tensorboard; with it, train.py and sweep.py refuse in one line, exit code 2, nothing
    written."""
    blocked = tmp_path / "blocked" / "tensorboard"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('no tensorboard here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked.parent), ROOT]), "OMP_NUM_THREADS": "1"}
    data = [f"--dataset={corpus}", f"--data_dir={prepared(corpus)}"]

    def script(name, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, name), *data, *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    trained = script("train.py", *tiny(max_iters=2), f"--out_dir={tmp_path / 'plain'}")
    assert trained.returncode == 0, trained.stderr
    sweep_flags = [*SWEEP_TINY, "--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 'sweep'}"]
    for name, args in (("train.py", [*tiny(max_iters=2), f"--out_dir={tmp_path / 'watched'}"]),
                       ("sweep.py", sweep_flags)):
        refused = script(name, *args, "--tensorboard")
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.startswith(f"{name}: ") and refused.stderr.endswith(
            "--tensorboard needs the tensorboard package, which is not installed; pip install tensorboard, or run "
            "with --tensorboard=False\n"), refused.stderr
    assert not (tmp_path / "watched").exists() and not (tmp_path / "sweep").exists()

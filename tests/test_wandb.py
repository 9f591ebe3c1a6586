"""--wandb (engine/wandb_view.py): the offline W&B run, read back from its .wandb file with wandb's own record
schema, holds log.jsonl's steps and numbers (the same scalars as --tensorboard), the run's config.json and its tags;
a resume continues the W&B run; a sweep's runs are in one project, grouped and tagged; plot.py --wandb writes a
finished run's; a W&B that fails is one note and the run ends as it would (exit code 0). No test reaches the
network: W&B has no API key here (so the runs are offline, as without one anywhere), and its server address is a
closed port on this machine."""

import contextlib
import glob
import importlib.util
import io
import json
import os
import shlex
import socket
import struct
import zlib

import pytest

from engine import views
from engine import wandb_view
from engine.flags import UsageError
import plot
import sweep
from conftest import SWEEP_TINY, events, prepared, run, tiny, torchrun, train_argv, train_process

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed (requirements.txt names it: pip install wandb)")]


def closed_port():
    """A port on this machine that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def no_network(tmp_path_factory):
    """W&B as on a machine without an API key: no key in the environment, no .netrc, no settings file; and its
    server a closed port here, so that even a key found elsewhere would reach nothing; no error reports."""
    home = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DIR", "WANDB_INIT_TIMEOUT"):
            patch.delenv(name, raising=False)
        patch.setenv("NETRC", str(home / "netrc"))
        patch.setenv("WANDB_CONFIG_DIR", str(home / "config"))
        patch.setenv("WANDB_CACHE_DIR", str(home / "cache"))
        patch.setenv("WANDB_DATA_DIR", str(home / "data"))
        patch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
        patch.setenv("WANDB_ERROR_REPORTING", "false")
        yield


def records(path):
    """The records of a W&B run's .wandb file, read as W&B writes it: a header (":W&B", 0xBEE1, version 0), then
    LevelDB's log format (32 KiB blocks of chunks, each a CRC-32 seeded with its kind, a length and a kind: FULL, or
    FIRST, MIDDLE..., LAST), each record parsed with wandb's own schema (wandb_internal_pb2.Record)."""
    from wandb.proto import wandb_internal_pb2  # here: only the tests that read a run need wandb
    with open(path, "rb") as f:
        data = f.read()
    assert data[:7] == struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
    at, pieces = 7, b""
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:  # a block's tail too short for a chunk's header is padding
            at += 32768 - at % 32768
            continue
        crc, length, kind = struct.unpack("<IHB", data[at:at + 7])
        chunk = data[at + 7:at + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc
        at, pieces = at + 7 + length, pieces + chunk
        if kind in (1, 4):  # FULL or LAST: a record is whole
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            yield record
            pieces = b""


def value(item):
    return item.key or "/".join(item.nested_key), json.loads(item.value_json)


def read_run(sync_dir):
    """(its run record, its history rows {key: value} without W&B's own _keys, its summary) of an offline run."""
    [path] = glob.glob(os.path.join(sync_dir, "run-*.wandb"))
    run_record, history, summary = None, [], {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_record = record.run
        elif kind == "history":
            history.append({k: v for k, v in map(value, record.history.item) if not k.startswith("_")})
        elif kind == "summary":
            summary.update(map(value, record.summary.update))
    return run_record, history, summary


def offline_runs(out_dir):
    return sorted(glob.glob(os.path.join(out_dir, "wandb", "offline-run-*")))


def config_of(run_record):
    return {k: v for k, v in map(value, run_record.config.update) if k != "_wandb"}


def offline_note(script, sync_dir):
    return (f"{script}: note: --wandb: no W&B API key here (WANDB_API_KEY, or `wandb login`), so the W&B run is "
            f"offline, in {sync_dir}; upload it with: wandb sync {shlex.quote(sync_dir)}")


def wandb_notes(err):
    return [line for line in err.splitlines() if "--wandb" in line]


def top_level_numbers(event):
    """{<event>/<key>: value} of the numbers at the top of a log line, bools as 1 or 0."""
    return {f"{event['event']}/{key}": float(v) for key, v in event.items()
            if key not in ("event", "step") and isinstance(v, (bool, int, float))}


@pytest.fixture(scope="module")
def sent(corpus, tmp_path_factory):
    """A tiny run with --wandb, telemetry and headroom every 2 steps: its folder and what it said on stderr."""
    folder = tmp_path_factory.mktemp("sent")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert run(corpus, folder, *tiny(max_iters=4, eval_interval=2), "--wandb", "--telemetry_interval=2",
                   "--fp16_headroom_interval=2", "--attn_impl=manual") == 0
    return folder / "out", err.getvalue()


def test_the_offline_run_holds_log_jsonls_steps_and_numbers(sent):
    """Without an API key the run is offline, in the run folder, said once with its `wandb sync`; its history has
    one row per event with numbers, in order: the step, and the very numbers of log.jsonl (train loss at each
    logged step among them) under the tags every view uses; the summary holds the end of the run."""
    out, err = sent
    [sync_dir] = offline_runs(out)
    assert wandb_notes(err) == [offline_note("train.py", sync_dir)]
    log = events(out)
    run_record, history, summary = read_run(sync_dir)
    shown = [e for e in log if views.scalars(e)]
    assert len(history) == len(shown) and {e["event"] for e in shown} >= {"train", "eval", "telemetry", "headroom"}
    for row, event in zip(history, shown):
        assert row["step"] == event["step"]
        assert top_level_numbers(event).items() <= row.items()
        assert row == {"step": event["step"], **dict(views.scalars(event))}
    assert [(row["step"], row["train/loss"]) for row in history if "train/loss" in row] == [
        (e["step"], e["loss"]) for e in log if e["event"] == "train"]
    telemetry = [(row["step"], row["telemetry.acts.std/fc2/layer_1"]) for row in history
                 if "telemetry.acts.std/fc2/layer_1" in row]
    assert telemetry == [(e["step"], row["std"]) for e in log if e["event"] == "telemetry" for row in e["acts"]
                         if (row["op"], row["layer"]) == ("fc2", 1)] and telemetry
    [done] = [e for e in log if e["event"] == "done"]
    assert summary["done"] == done
    # the W&B run: nanoGPT's names, the run's config.json as its config, its tags, its id kept for a resume
    assert (run_record.project, run_record.display_name, run_record.run_group) == ("nanonorm", "out", "")
    assert list(run_record.tags) == ["lr:0.003", "seed:1337"]
    with open(out / "config.json") as f:
        assert config_of(run_record) == {**json.load(f), "tags": {"lr": "0.003", "seed": "1337"}}
    with open(out / "wandb.json") as f:
        assert json.load(f) == {"id": run_record.run_id}


@pytest.mark.slow
def test_a_resumed_run_continues_its_wandb_run(corpus, tmp_path, capsys):
    """A run logs steps 1-4, then resumes from its checkpoint at step 2 (--wandb from the checkpoint): a second
    offline run of the same W&B run id, which logs steps 3 and 4 with the resumed log's losses. A fresh run in the
    folder forgets that W&B run: without --wandb it leaves no wandb.json, with it a new id."""
    flags = [*tiny(max_iters=4, eval_interval=2), "--keep_checkpoints=2"]
    assert run(corpus, tmp_path, *flags, "--wandb") == 0
    out = tmp_path / "out"
    with open(out / "wandb.json") as f:
        first_id = json.load(f)["id"]
    for name in ("ckpt.pt", "ckpt-4.pt"):
        os.remove(out / name)
    assert run(corpus, tmp_path, *flags, "--resume") == 0
    first, resumed = offline_runs(out)
    assert read_run(first)[0].run_id == read_run(resumed)[0].run_id == first_id
    _, history, summary = read_run(resumed)
    log = events(out)
    assert [(row["step"], row["train/loss"]) for row in history if "train/loss" in row] == [
        (e["step"], e["loss"]) for e in log if e["event"] == "train" and e["step"] > 2]
    assert summary["done"] == log[-1]
    assert len(wandb_notes(capsys.readouterr().err)) == 2  # one note a start
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--overwrite") == 0
    assert not (out / "wandb.json").exists()
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--overwrite", "--wandb") == 0
    with open(out / "wandb.json") as f:
        assert json.load(f)["id"] != first_id


@pytest.mark.slow
def test_a_wandb_that_fails_is_a_note_and_the_run_ends_as_it_would(corpus, tmp_path, monkeypatch, capsys):
    """A W&B folder that cannot be written (WANDB_DIR inside a file), and a W&B whose log fails mid-run: each is
    one note, the run trains every step and exits 0."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("WANDB_DIR", str(blocker / "wandb"))
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--wandb") == 0
    assert wandb_notes(capsys.readouterr().err) == [
        f"train.py: note: --wandb: cannot start the W&B run ([Errno 20] Not a directory: '{blocker / 'wandb'}'); the "
        "view ends before it began, log.jsonl holds every event"]
    assert [e["step"] for e in events(tmp_path / "out", "train")] == [1, 2]
    monkeypatch.delenv("WANDB_DIR")

    import wandb

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wandb.Run, "log", full)
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--wandb", "--overwrite") == 0
    notes = wandb_notes(capsys.readouterr().err)
    assert notes[1:] == ["train.py: note: --wandb: W&B failed ([Errno 28] No space left on device); the view ends at "
                         "step 0, log.jsonl holds every event"]
    assert [e["step"] for e in events(tmp_path / "out", "train")] == [1, 2]


@pytest.mark.slow
def test_an_online_start_that_fails_goes_offline(corpus, tmp_path):
    """With an API key and a W&B server that does not answer (a closed port here), the run goes offline after
    WANDB_INIT_TIMEOUT seconds, says why in its one note, and trains to the end."""
    out = tmp_path / "out"
    result = train_process(*train_argv(corpus, prepared(corpus), out, *tiny(max_iters=2), "--wandb"),
                           env={"WANDB_API_KEY": "a" * 86, "WANDB_INIT_TIMEOUT": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    [sync_dir] = offline_runs(out)
    [note] = wandb_notes(result.stderr)
    assert note.startswith("train.py: note: --wandb: W&B online failed (") and note.endswith(
        f", so the W&B run is offline, in {sync_dir}; upload it with: wandb sync {shlex.quote(sync_dir)}")
    assert [row["step"] for row in read_run(sync_dir)[1] if "train/loss" in row] == [1, 2]


@pytest.mark.slow
def test_only_process_0_sends(corpus, tmp_path):
    result = torchrun(2, *train_argv(corpus, prepared(corpus), tmp_path / "out", *tiny(max_iters=2), "--wandb"))
    assert result.returncode == 0, result.stderr[-2000:]
    [sync_dir] = offline_runs(tmp_path / "out")
    assert [row["step"] for row in read_run(sync_dir)[1] if "train/loss" in row] == [1, 2]
    assert len(wandb_notes(result.stderr)) == 1


@pytest.mark.slow
def test_a_sweeps_runs_are_in_one_project_grouped_and_tagged(corpus, tmp_path, capsys):
    """sweep.py --wandb: every run in the one project, in the sweep's group, named <variant>/<lr>/<seed> and tagged
    with its variant, LR and seed; the same sweep without --wandb finds its runs finished (watching is no setting);
    a recipe's runs are grouped by the recipe and tagged with it."""
    out = tmp_path / "lr_sweep"
    argv = ["--variants=baseline,norm=rmsnorm", "--lrs=1e-2", "--seeds=1", "--jobs=2", f"--out_dir={out}",
            f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", *SWEEP_TINY]
    assert sweep.main([*argv, "--wandb", "--wandb_project=norms"]) == 0
    for variant in ("baseline", "norm=rmsnorm"):
        [sync_dir] = offline_runs(out / variant / "1e-2" / "0")
        run_record, history, _ = read_run(sync_dir)
        assert (run_record.project, run_record.run_group, run_record.display_name) == (
            "norms", "lr_sweep", f"{variant}/1e-2/0")
        preset = {"preset": variant} if variant == "baseline" else {}  # a variant named as a preset is --preset
        tags = {"lr": "0.01", "seed": "0", **preset, "variant": variant}
        assert list(run_record.tags) == [f"{key}:{value}" for key, value in tags.items()]
        assert config_of(run_record)["tags"] == tags
        assert [row["step"] for row in history if "train/loss" in row] == [1, 2, 3, 4]
    capsys.readouterr()
    assert sweep.main(argv) == 0
    assert "2 runs, 2 finished already" in capsys.readouterr().out
    assert sweep.main(["--recipe=normformer_stability", "--dry_run", "--wandb", f"--out_dir={tmp_path / 'recipe'}"]) \
        == 0
    commands = capsys.readouterr().out.splitlines()
    assert commands
    for command in commands:
        given = dict(arg[2:].split("=", 1) for arg in shlex.split(command) if "=" in arg)
        variant = os.path.relpath(given["out_dir"], tmp_path / "recipe").split(os.sep)[0]
        assert given["wandb_group"] == "normformer_stability"
        assert given["wandb_tags"] == f"recipe:normformer_stability,variant:{variant}"


@pytest.mark.slow
def test_plot_writes_a_finished_runs_wandb_run_as_train_would_have(corpus, tmp_path, capsys):
    """A run without --wandb, sent afterwards: plot.py --wandb writes its offline W&B run from log.jsonl, with every
    number train.py --wandb would have logged, and draws no picture."""
    assert run(corpus, tmp_path, *tiny(max_iters=4, eval_interval=2), "--telemetry_interval=2") == 0
    out = tmp_path / "out"
    assert not offline_runs(out)
    capsys.readouterr()
    assert plot.main([str(out), "--wandb"]) == 0
    [sync_dir] = offline_runs(out)
    said = capsys.readouterr()
    assert wandb_notes(said.err) == [offline_note("plot.py", sync_dir)]
    assert said.out.splitlines()[-1] == "plot.py: the W&B run of 1 run written from its log.jsonl"
    _, history, summary = read_run(sync_dir)
    log = events(out)
    assert history == [{"step": e["step"], **dict(views.scalars(e))} for e in log if views.scalars(e)]
    assert summary["done"] == log[-1]
    assert not (tmp_path / "plots").exists()


def test_plot_refuses_wandb_with_pictures_or_the_page(tmp_path, capsys):
    for argv in ([str(tmp_path), "--wandb", f"--out={tmp_path / 'pictures'}"],
                 ["--wandb", f"--experiments={tmp_path}"]):
        assert plot.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("plot.py: --wandb ") and err.count("\n") == 1


def test_without_wandb_installed_wandb_is_one_line_and_nothing_is_written(corpus, tmp_path, monkeypatch, capsys):
    """wandb not installed: train.py and sweep.py refuse --wandb in one line, exit code 2, before writing anything;
    nothing else looks for it."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    line = "--wandb needs the wandb package, which is not installed; pip install wandb, or run without --wandb\n"
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--wandb") == 2
    assert capsys.readouterr().err == f"train.py: {line}"
    assert sweep.main(["--variants=baseline", "--lrs=1e-2", f"--out_dir={tmp_path / 'sweep'}", f"--dataset={corpus}",
                       f"--data_dir={prepared(corpus)}", *SWEEP_TINY, "--wandb"]) == 2
    assert capsys.readouterr().err == f"sweep.py: variant baseline: {line}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "sweep").exists()
    with pytest.raises(UsageError):
        wandb_view.check_installed(True)
    wandb_view.check_installed(False)


@pytest.mark.parametrize("flag, said", [
    ("--wandb_project=team/lab", "--wandb_project=team/lab is not a W&B project name; give 1-128 characters, none of "
                                 "/ \\ # ? % :"),
    ("--wandb_group=" + "g" * 129, "--wandb_group has 129 characters; give 1-128")])
def test_a_name_wandb_refuses_is_refused_before_anything_is_written(corpus, tmp_path, capsys, flag, said):
    assert run(corpus, tmp_path, *tiny(max_iters=2), "--wandb", flag) == 2
    assert capsys.readouterr().err == f"train.py: {said}\n"
    assert not (tmp_path / "out").exists()

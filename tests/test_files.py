"""Files judged by what they are: nanonorm opens its own files (run.lock, log.jsonl, a checkpoint's temporary file,
a prepared folder's lock and meta.json, a sweep's <seed>.out and config.json) only as regular files, never through a
symlink and never waiting on a FIFO; anything else is one line, exit code 2, and is left as it is."""

import os
import re
import signal
import shutil
import stat
from pathlib import Path

import pytest

import data
import sweep
import train
from engine import files, flags
from conftest import SWEEP_TINY, TINY, prepared, train_argv


@pytest.fixture
def no_hang():
    """A test that would wait forever (an open of a FIFO) fails after 20 s instead: SIGALRM interrupts the open."""
    def hung(signum, frame):
        raise TimeoutError("hung: an open or a read waited on a FIFO")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# Each of nanonorm's writes and reads of its own files: (the name it opens in a folder, what opens it)
OPENS = {
    "run.lock (claim)": ("run.lock", lambda folder: files.claim(str(folder)).close()),
    "run.lock (held_by)": ("run.lock", lambda folder: files.held_by(str(folder))),
    "log.jsonl (append)": ("log.jsonl", lambda folder: files.append_line(str(folder / "log.jsonl"), "{}\n")),
    "log.jsonl (read)": ("log.jsonl", lambda folder: files.read_log(str(folder / "log.jsonl"))),
    "a checkpoint's temporary file": ("ckpt.pt.tmp", lambda folder: files.write_atomic(
        str(folder / "ckpt.pt"), b"checkpoint", tmp=str(folder / "ckpt.pt.tmp"))),
    "a prepared folder's meta.json": ("meta.json", lambda folder: data.load_meta(folder)),
}


@pytest.mark.parametrize("name, opens", OPENS.values(), ids=OPENS)
def test_nothing_is_written_or_read_through_a_symlink(tmp_path, name, opens):
    (tmp_path / "important.txt").write_text("keep\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).symlink_to(tmp_path / "important.txt")
    says = re.escape(f"{tmp_path / 'run' / name} is a symlink to {tmp_path / 'important.txt'}")
    with pytest.raises(flags.UsageError, match=says):  # a NotAFile, or read_log's own line
        opens(tmp_path / "run")
    assert (tmp_path / "important.txt").read_text() == "keep\n"
    assert (tmp_path / "run" / name).is_symlink()  # the link is left as it is, too


@pytest.mark.parametrize("name, opens", OPENS.values(), ids=OPENS)
def test_a_fifo_in_place_of_a_file_is_refused_at_once(tmp_path, no_hang, name, opens):
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / name)
    with pytest.raises(flags.UsageError, match=re.escape(f"{tmp_path / 'run' / name} is not a regular file")):
        opens(tmp_path / "run")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "run" / name).st_mode)


def one_line(err, script, *pieces):
    assert err.count("\n") == 1 and err.startswith(f"{script}: ") and "Traceback" not in err, err
    for piece in pieces:
        assert piece in err, (piece, err)


def test_train_refuses_a_symlinked_run_lock_and_leaves_its_target(corpus, tmp_path, capsys):
    """ln -s ~/important.txt O/run.lock; python train.py ... --out_dir=O"""
    (tmp_path / "important.txt").write_text("keep\n")
    out = tmp_path / "O"
    out.mkdir()
    (out / "run.lock").symlink_to(tmp_path / "important.txt")
    assert train.main(train_argv(corpus, prepared(corpus), str(out), *TINY, "--max_iters=2")) == 2
    one_line(capsys.readouterr().err, "train.py", f"{out / 'run.lock'} is a symlink to")
    assert (tmp_path / "important.txt").read_text() == "keep\n"
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


def test_train_refuses_a_fifo_at_run_lock_at_once(corpus, tmp_path, capsys, no_hang):
    out = tmp_path / "O"
    out.mkdir()
    os.mkfifo(out / "run.lock")
    assert train.main(train_argv(corpus, prepared(corpus), str(out), *TINY, "--max_iters=2")) == 2
    one_line(capsys.readouterr().err, "train.py", f"{out / 'run.lock'} is not a regular file")
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


@pytest.mark.parametrize("name", ["0.out", "0/config.json"])
def test_a_sweep_refuses_a_fifo_among_its_runs_files_at_once(corpus, tmp_path, capsys, no_hang, name):
    """The FIFO at a run's console file (opened to write) or at a finished run's config.json (read to compare its
    flags with the command's)."""
    runs = tmp_path / "S" / "baseline" / "1e-2"
    (runs / "0").mkdir(parents=True)
    os.mkfifo(runs / name)
    if name == "0/config.json":
        (runs / "0" / "log.jsonl").write_text('{"event": "done", "step": 4, "val_loss": 3.0}\n')
    argv = [f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", f"--out_dir={tmp_path / 'S'}",
            "--variants=baseline", "--lrs=1e-2", "--seeds=1", *SWEEP_TINY]
    assert sweep.main(argv) == 2
    one_line(capsys.readouterr().err, "sweep.py", f"{runs / name} is not a regular file")
    assert stat.S_ISFIFO(os.lstat(runs / name).st_mode)
    assert not (runs / "0.exit").exists() and not (runs / "0" / "run.lock").exists()  # no run was started


def test_a_symlink_at_a_prepared_folders_lock_is_refused_and_its_target_left(tmp_path):
    (tmp_path / "important.txt").write_text("keep\n")
    (tmp_path / "corpus.txt").write_text("a corpus to prepare\n" * 50)
    folder = data.prepare(str(tmp_path / "corpus.txt"), data_dir=str(tmp_path / "data"))
    shutil.rmtree(folder)  # prepared again by the next call, under its lock
    lock = Path(f"{folder}.lock")
    lock.unlink()
    lock.symlink_to(tmp_path / "important.txt")
    with pytest.raises(flags.UsageError, match=re.escape(f"{lock} is a symlink to")):
        data.prepare(str(tmp_path / "corpus.txt"), data_dir=str(tmp_path / "data"))
    assert (tmp_path / "important.txt").read_text() == "keep\n"

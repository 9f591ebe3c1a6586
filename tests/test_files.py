"""Nothing lost, nothing cryptic, no silent harm: one run per out_dir, writes that fail on a full
or read-only disk, torn and foreign logs, models too big for the machine, a resume onto other data, best_val and
the instruments' bounds across a resume, stops in evaluations and by SIGHUP, a FIFO for a checkpoint, and bad
input under a real 2-process torchrun."""

import builtins
import errno
import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import data
import model
import configs
import sweep
import train
from engine import files, flags, run_folder, run_reader, runtime, signals
from conftest import (PAUSED_TRAIN, ROOT, SWEEP_TINY, TINY, FailingWrites, events, prepared, resumed_line,
                      save_checkpoint, torchrun, train_argv, train_process)


def flags_of(corpus, out, *more):
    return train_argv(corpus, prepared(corpus), out, *TINY, *more)


def steps(out, kind="train"):
    return [e["step"] for e in events(out) if e["event"] == kind]


def contents(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def one_line(err, *pieces):
    assert err.count("\n") == 1 and err.startswith("train.py: ") and "Traceback" not in err, err
    for piece in pieces:
        assert piece in err, (piece, err)


def start(args, **env):
    return subprocess.Popen([sys.executable, "train.py", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def wait_for(process, printed):
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if printed in process.stdout.readline():
            return
    raise AssertionError(f"the run never printed {printed!r} (exit code {process.poll()})")


# One run per out_dir

@pytest.mark.slow
def test_a_held_out_dir_refuses_a_second_run_and_a_killed_holder_releases_it(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    run = flags_of(corpus, out, "--max_iters=6", "--eval_interval=2")
    # paused (asleep) inside step 3, after the step-2 checkpoint
    holder = subprocess.Popen([sys.executable, "-c", PAUSED_TRAIN, "step@3", *run], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_for(holder, "paused at step@3")
        assert files.held_by(out) == f"PID {holder.pid} on {socket.gethostname()}"
        before = contents(out)
        for extra in (["--resume"], [], ["--overwrite"]):  # the second run in this process: the lock is the kernel's
            assert train.main([*run, *extra]) == 2
            one_line(capsys.readouterr().err, f"--out_dir={out} is in use by a run (PID {holder.pid} on "
                                              f"{socket.gethostname()})")
            assert contents(out) == before  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert files.held_by(out) is None  # the kernel dropped the dead holder's lock
    assert train.main([*run, "--resume"]) == 0
    assert steps(out) == [1, 2, 3, 4, 5, 6]


def test_claim_and_held_by_in_one_process(tmp_path):
    lock = files.claim(str(tmp_path / "run"))
    assert files.held_by(str(tmp_path / "run")) == f"PID {os.getpid()} on {socket.gethostname()}"
    with pytest.raises(flags.UsageError, match=f"is in use by a run \\(PID {os.getpid()} on "):
        files.claim(str(tmp_path / "run"))  # another open file: flock refuses it even in the same process
    lock.close()
    assert files.held_by(str(tmp_path / "run")) is None
    assert files.held_by(str(tmp_path / "never-made")) is None and not (tmp_path / "never-made").exists()


def test_held_by_only_looks_so_two_lookers_do_not_see_each_other_as_a_run(tmp_path):
    """held_by takes a shared lock: another command looking at the folder at the same moment (a sweep, plot.py, a
    summary) holds one too, and is not a run."""
    (tmp_path / files.LOCK).write_text("")
    with open(tmp_path / files.LOCK) as looker:
        fcntl.flock(looker, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert files.held_by(str(tmp_path)) is None


# Disk full or read-only, at every write site

class FillingDisk(io.FileIO):
    """A file on a disk that fills up after `budget` more bytes: a write past them fails with ENOSPC (after the
    writes before it succeeded, unlike FailingWrites, whose open fails)."""

    def __init__(self, path, mode, budget):
        super().__init__(path, mode)
        self.budget = budget

    def write(self, data):
        if len(data) > self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        self.budget -= len(data)
        return super().write(data)


def disk_fills(monkeypatch, name, budget):
    """Files whose names start with `name`, opened to write, are on a disk that fills after `budget` bytes."""
    real = builtins.open

    def patched_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.basename(file).startswith(name) and \
                any(c in mode for c in "wax+"):
            raw = FillingDisk(file, mode.replace("b", "").replace("t", ""), budget)
            buffered = io.BufferedRandom(raw) if "+" in mode else io.BufferedWriter(raw)
            return buffered if "b" in mode else io.TextIOWrapper(buffered)
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", patched_open)


@pytest.mark.parametrize("name, budget", [("run.lock", 0), ("ckpt.pt", 1000)])
def test_a_disk_that_fills_during_a_write_names_the_full_disk(corpus, tmp_path, monkeypatch, capsys, name, budget):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        disk_fills(patch, name, budget)
        assert train.main(flags_of(corpus, out, "--max_iters=2", "--eval_interval=2")) == 1
    one_line(capsys.readouterr().err, f"cannot write {out / name} (No space left on device)")
    assert leftovers(tmp_path) == []


def leftovers(root):
    return [str(p) for p in root.rglob("*") if ".tmp" in p.name]


@pytest.mark.parametrize("name, code", [("run.lock", errno.ENOSPC), ("log.jsonl", errno.ENOSPC),
                                        ("config.json", errno.ENOSPC), ("config.json", errno.EROFS),
                                        ("ckpt.pt", errno.ENOSPC)])
def test_a_fresh_run_on_a_full_or_read_only_disk_is_one_line_and_a_retry_runs(corpus, tmp_path, monkeypatch,
                                                                               capsys, name, code):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        FailingWrites(patch, code, name)
        assert train.main(flags_of(corpus, out, "--max_iters=2", "--eval_interval=2")) == 1
    one_line(capsys.readouterr().err, f"cannot write {out / name}", f"({os.strerror(code)})")
    assert leftovers(tmp_path) == []
    assert run_folder.holds_a_run(str(out)) == ([] if name != "ckpt.pt" else ["config.json", "log.jsonl"])
    if name != "ckpt.pt":  # a run that wrote nothing but empty files holds nothing: the same command runs
        assert train.main(flags_of(corpus, out, "--max_iters=2", "--eval_interval=2")) == 0


@pytest.mark.parametrize("name", ["train.bin", "val.bin", "meta.json"])
def test_data_preparation_on_a_full_disk_leaves_no_folder(tmp_path, monkeypatch, capsys, name):
    text = tmp_path / "fresh.txt"
    text.write_text("a corpus no test has prepared yet\n" * 50)
    with monkeypatch.context() as patch:
        FailingWrites(patch, errno.ENOSPC, name)
        assert train.main(flags_of(str(text), tmp_path / "out", "--max_iters=2")) == 1
    one_line(capsys.readouterr().err, f"cannot write {tmp_path / 'data'}", f"/{name} (No space left on device)")
    assert [p.name for p in (tmp_path / "data").iterdir() if p.is_dir()] == []  # complete or absent: absent
    assert leftovers(tmp_path) == [] and not (tmp_path / "out").exists()


@pytest.fixture
def checkpointed(corpus, tmp_path):
    """A run stopped at step 4 with checkpoints at 2 and 4 (ckpt-2.pt kept)."""
    out = tmp_path / "out"
    assert train.main(flags_of(corpus, out, "--max_iters=4", "--eval_interval=2", "--keep_checkpoints=2",
                               "--lr_decay_iters=12")) == 0
    return out


def test_a_resume_on_a_full_disk_keeps_the_log_and_the_checkpoint(corpus, checkpointed, monkeypatch, capsys):
    before = contents(checkpointed)
    capsys.readouterr()
    with monkeypatch.context() as patch:
        FailingWrites(patch, errno.ENOSPC, "log.jsonl")
        assert train.main(flags_of(corpus, checkpointed, "--resume", "--max_iters=8")) == 1
    one_line(capsys.readouterr().err, f"cannot write {checkpointed / 'log.jsonl'} (No space left on device)")
    assert contents(checkpointed) == before
    assert leftovers(checkpointed) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", ["a log line mid-run", "read-only after a checkpoint"])
def test_a_disk_that_fills_or_turns_read_only_mid_run_loses_nothing(corpus, checkpointed, monkeypatch, capsys,
                                                                   case):
    """Resumed at step 4; the first write after step 5's log line fails (a full disk), or every write after the
    step-6 checkpoint (a filesystem remounted read-only). The log keeps its whole lines, the checkpoint stays, and
    the run resumes exactly once the disk is back."""
    common = flags_of(corpus, checkpointed, "--max_iters=8", "--eval_interval=2", "--keep_checkpoints=2")
    capsys.readouterr()
    with monkeypatch.context() as patch:
        if case == "a log line mid-run":
            # the resume rewrites the log (1 write), then appends train 5 (2) and train 6 (3)
            FailingWrites(patch, errno.ENOSPC, "log.jsonl", after=2)
            failed, saved = "log.jsonl", 4
        else:
            FailingWrites(patch, errno.EROFS, under=checkpointed, once=checkpointed / "ckpt-6.pt")
            failed, saved = "log.jsonl", 6
        assert train.main([*common, "--resume"]) == 1
    resumed, failure = capsys.readouterr().err.split("\n", 1)
    assert resumed == resumed_line(4, 8, 4)
    one_line(failure, f"cannot write {checkpointed / failed}")
    lines = (checkpointed / "log.jsonl").read_bytes()
    assert lines.endswith(b"\n") and run_reader.read_log(str(checkpointed / "log.jsonl"))[1] == ""
    assert torch.load(checkpointed / "ckpt.pt", weights_only=True)["step"] == saved
    assert leftovers(checkpointed) == []
    assert train.main([*common, "--resume"]) == 0
    assert steps(checkpointed) == list(range(1, 9))


def test_write_atomic_and_append_line_keep_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "f"
    files.write_atomic(str(path), b"old\n")
    files.append_line(str(path), "line\n")
    write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: write(fd, data[:3]) if len(data) > 3 else
                        (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(files.WriteError, match="No space left on device"):
        files.append_line(str(path), "a longer line\n")  # 3 bytes written, then the disk is full
    assert path.read_bytes() == b"old\nline\n"
    monkeypatch.undo()
    with monkeypatch.context() as patch:
        FailingWrites(patch, errno.EROFS, "f.")
        with pytest.raises(files.WriteError, match="Read-only file system"):
            files.write_atomic(str(path), b"new\n")
    with monkeypatch.context() as patch:  # the temporary file is written, then the disk is found full
        patch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
        with pytest.raises(files.WriteError, match=f"cannot write {path} \\(No space left on device\\)"):
            files.write_atomic(str(path), b"new\n")
    assert path.read_bytes() == b"old\nline\n" and leftovers(tmp_path) == []


# One log reader

FOREIGN_LOGS = [
    (b'{"event": "eval", "step": 0}\nnot json\n{"event": "eval", "step": 2}\n', ":2: not JSON"),
    (b'{"event": "eval", "step": 0}\n[1, 2]\n', ':2: not an event (a JSON object with an "event" name)'),
    (b'{"step": 3}\n', ':1: not an event'),
    (b'{"event": 7, "step": 3}\n', ':1: not an event'),
    (b'{"event": "train", "step": 1}\n{"event": "caf\xe9"}\n', ":2: not UTF-8 text"),
    (b'\n', ":1: not JSON"),
    (b'{"event": "train", "step": 1}\n' + b"[" * 100_000 + b"\n", ":2: not JSON"),  # past json's recursion limit
]


def test_read_config_refuses_a_config_json_nested_past_the_recursion_limit(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"model": ' + b"[" * 100_000)
    with pytest.raises(flags.UsageError) as e:
        run_reader.read_config(str(tmp_path))
    assert f"{tmp_path / 'config.json'} is not a config.json train.py wrote" in str(e.value)


@pytest.mark.parametrize("content, says", FOREIGN_LOGS)
def test_read_log_names_the_file_and_line_of_a_foreign_log(tmp_path, content, says):
    (tmp_path / "log.jsonl").write_bytes(content)
    with pytest.raises(flags.UsageError) as e:
        run_reader.read_log(str(tmp_path / "log.jsonl"))
    assert f"{tmp_path / 'log.jsonl'}{says}" in str(e.value) and "\n" not in str(e.value)


def test_read_log_leaves_out_a_torn_last_line_and_says_so(tmp_path):
    path = tmp_path / "log.jsonl"
    first, second = ({"event": "train", "step": step, "loss": loss, "lr": 0.1} for step, loss in ((1, 5), (2, 4)))
    path.write_bytes(f"{json.dumps(first)}\n{json.dumps(second)}\n".encode() + b'{"event": "tr')
    assert run_reader.read_log(str(path)) == ([first, second],
                                              f"{path}:3: the last line was cut short (a killed run); left out")
    path.write_bytes(f"{json.dumps(first)}\n".encode() + b"\xe2\x82")  # cut inside a UTF-8 character
    assert run_reader.read_log(str(path))[0] == [first]
    assert run_reader.read_log(str(tmp_path / "absent.jsonl")) == ([], "")


@pytest.mark.parametrize("kind, says", [("folder", "is a folder, not a file"),
                                        ("broken symlink", "is a symlink to"),
                                        ("symlink loop", "is in a symlink loop"),
                                        ("fifo", "is not a regular file")])
def test_read_log_refuses_what_is_not_a_file(tmp_path, kind, says):
    path = tmp_path / "log.jsonl"
    if kind == "folder":
        path.mkdir()
    elif kind == "broken symlink":
        path.symlink_to(tmp_path / "gone.jsonl")
    elif kind == "symlink loop":
        path.symlink_to(path)
    else:
        os.mkfifo(path)
    with pytest.raises(flags.UsageError, match=says):
        run_reader.read_log(str(path))


def test_resume_refuses_a_foreign_log_and_leaves_every_file(corpus, checkpointed, capsys):
    log = checkpointed / "log.jsonl"
    log.write_bytes(log.read_bytes().replace(b'"event": "eval", "step": 2', b'"event": "eval", "step": 2, oops', 1))
    before = contents(checkpointed)
    capsys.readouterr()
    assert train.main(flags_of(corpus, checkpointed, "--resume", "--max_iters=6")) == 2
    line = [n for n, text in enumerate(log.read_text().splitlines(), 1) if "oops" in text][0]
    one_line(capsys.readouterr().err, f"{log}:{line}: not JSON")
    assert contents(checkpointed) == before  # never rewrites a log it could not parse


def test_resume_drops_a_torn_last_line_with_a_note(corpus, checkpointed, capsys):
    log = checkpointed / "log.jsonl"
    whole = log.read_bytes()
    torn_line = len(whole.splitlines()) + 1
    log.write_bytes(whole + b'{"event": "train", "step": 5, "lo')
    capsys.readouterr()
    assert train.main(flags_of(corpus, checkpointed, "--resume", "--max_iters=6")) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: note: {log}:{torn_line}: the last line was cut short (a killed run); left out",
        resumed_line(4, 6, 4)]
    assert steps(checkpointed) == [1, 2, 3, 4, 5, 6]


def test_resume_with_a_deleted_log_says_so_and_logs_from_the_checkpoint(corpus, checkpointed, capsys):
    log = checkpointed / "log.jsonl"
    log.unlink()
    capsys.readouterr()
    assert train.main(flags_of(corpus, checkpointed, "--resume", "--max_iters=6")) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"train.py: note: {log} is missing; the resumed run's log starts at its checkpoint's step",
        resumed_line(4, 6, 4)]
    assert steps(checkpointed) == [5, 6]


# Models that cannot fit

@pytest.mark.parametrize("overrides", [{}, dict(n_embd=96, n_head=4, activation="geglu"),
                                       dict(tie_embeddings=False, pos="sinusoidal", n_layer=3, n_embd=64),
                                       dict(vocab_size=512, block_size=64, ffn_mult=2, n_embd=64, bias=False)])
def test_the_parameter_estimate_is_within_5_percent_of_a_direct_count(overrides):
    cfg = model.GPTConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 32, **overrides})
    counted = model.GPT(cfg).num_params()
    assert abs(runtime.parameter_estimate(cfg) - counted) <= 0.05 * counted, (runtime.parameter_estimate(cfg), counted)


def test_the_memory_estimate_counts_parameters_optimizer_and_activations():
    cfg, tc = model.GPTConfig(), configs.TrainConfig(dtype="float32")
    params = runtime.parameter_estimate(cfg)
    base = runtime.memory_estimate(cfg, tc)
    assert base > 16 * params
    doubled = runtime.memory_estimate(cfg, configs.TrainConfig(dtype="float32", batch_size=2 * tc.batch_size))
    assert doubled - base == base - 16 * params  # activations grow with the batch, the parameters' share does not


@pytest.mark.parametrize("model_flags, train_flags", [(dict(n_embd=10 ** 9), {}), (dict(n_layer=10 ** 6), {}),
                                                      ({}, dict(batch_size=10 ** 9))])
def test_a_model_that_cannot_fit_is_refused_before_it_is_built(model_flags, train_flags):
    cfg, tc = model.GPTConfig(**model_flags), configs.TrainConfig(dtype="float32", **train_flags)
    runtime.check_memory(model.GPTConfig(), configs.TrainConfig(dtype="float32"), "cpu", runtime.Machine())
    with pytest.raises(flags.UsageError) as e:
        runtime.check_memory(cfg, tc, "cpu", runtime.Machine())
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert f"need about {runtime.memory_estimate(cfg, tc) / 1e9:.3g} GB" in str(e.value)
    assert f"this machine's memory has {have / 1e9:.3g} GB" in str(e.value)


# best_val and the instruments' bounds across a resume

def test_resume_reads_best_val_and_best_step_back(corpus, tmp_path):
    """A run whose best checkpoint is at step 3 (its val loss made unbeatable here): a resume that forgot it
    would call a later one the best and let --keep_checkpoints=1 delete ckpt-3.pt."""
    out = tmp_path / "out"
    assert train.main(flags_of(corpus, out, "--max_iters=3", "--eval_interval=3", "--lr_decay_iters=9")) == 0
    checkpoint = torch.load(out / "ckpt.pt", weights_only=True)
    save_checkpoint({**checkpoint, "best_val": 0.0, "best_step": 3}, out / "ckpt.pt")
    # the log says the same, as a run's own log does (a resume holds the two to each other)
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    (out / "log.jsonl").write_text("".join(json.dumps({**e, "val_loss": 0.0} if e["event"] == "eval" and e["step"] == 3
                                                      else e) + "\n" for e in logged))
    assert train.main(flags_of(corpus, out, "--resume", "--max_iters=9", "--keep_checkpoints=1")) == 0
    resumed = torch.load(out / "ckpt.pt", weights_only=True)
    assert (resumed["step"], resumed["best_val"], resumed["best_step"]) == (9, 0.0, 3)
    assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-3.pt", "ckpt-9.pt", "ckpt.pt"]


def test_a_new_diverge_loss_given_with_resume_applies(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main(flags_of(corpus, out, "--max_iters=3", "--eval_interval=3", "--diverge_loss=100")) == 0
    capsys.readouterr()
    assert train.main(flags_of(corpus, out, "--resume", "--max_iters=9", "--diverge_loss=1.0")) == 3
    assert "above the bound 1.0000 for 3 steps" in capsys.readouterr().out
    assert [e["step"] for e in events(out) if e["event"] == "diverged"] == [5]  # steps 4, 5, 6 above it


@pytest.fixture(scope="module")
def periodic_corpus(tmp_path_factory):
    """Lines that repeat with periods 7, 5 and 3: the resumed run below meets a spike on it (on the shared corpus
    its loss after the resume gives none)."""
    path = tmp_path_factory.mktemp("periodic") / "tiny.txt"
    path.write_text("".join(f"the norm {i % 7} of layer {i % 5} scales residual {i % 3}\n" for i in range(400)))
    return str(path)


def test_a_new_spike_window_and_z_given_with_resume_apply(periodic_corpus, tmp_path):
    out, corpus = tmp_path / "out", periodic_corpus
    assert train.main(flags_of(corpus, out, "--max_iters=3", "--eval_interval=3", "--spike_window=50")) == 0
    assert train.main(flags_of(corpus, out, "--resume", "--max_iters=6", "--spike_window=2", "--spike_z=1e-9",
                               "--diverge_gap=0")) == 0
    monitor = torch.load(out / "ckpt.pt", weights_only=True)["spike_monitor"]
    assert (monitor["window"], monitor["z_threshold"]) == (2, 1e-9) and len(monitor["losses"]) == 2
    assert [e["step"] for e in events(out) if e["event"] == "spike"]  # any move up from a 2-step window is one


# The data a run trained on

@pytest.mark.slow
def test_a_resume_from_another_folder_reads_the_runs_data_and_refuses_changed_data(tmp_path, monkeypatch, capsys):
    """Started in folder a with relative paths; resumed from folder b, which has a tiny.txt of its own: the run
    goes on with a's data (its paths were recorded absolute), and once a's tiny.txt is edited, the resume is
    refused in one line."""
    for name, word in (("a", "norm"), ("b", "spike")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tiny.txt").write_text(f"the {word} of each layer scales\n" * 300)
    monkeypatch.chdir(tmp_path / "a")
    relative = ["--dataset=tiny.txt", "--data_dir=data", *TINY]
    assert train.main([*relative, "--out_dir=out", "--max_iters=2", "--eval_interval=2"]) == 0
    config = json.loads((tmp_path / "a" / "out" / "config.json").read_text())
    assert config["train"]["dataset"] == str(tmp_path / "a" / "tiny.txt")
    assert config["train"]["data_dir"] == str(tmp_path / "a" / "data")
    assert config["data"]["source"]["sha256"] == torch.load(tmp_path / "a" / "out" / "ckpt.pt",
                                                            weights_only=True)["data_sha256"]
    monkeypatch.chdir(tmp_path / "b")
    assert train.main(["--out_dir=../a/out", "--resume", "--max_iters=4"]) == 0
    assert not (tmp_path / "b" / "data").exists()
    (tmp_path / "a" / "tiny.txt").write_text("edited after the run started\n" * 300)
    before = contents(tmp_path / "a" / "out")
    capsys.readouterr()
    assert train.main(["--out_dir=../a/out", "--resume", "--max_iters=6"]) == 2
    one_line(capsys.readouterr().err, "--resume: the data has changed since the run started",
             str(tmp_path / "a" / "tiny.txt"))
    assert contents(tmp_path / "a" / "out") == before


# Stops: between eval batches, by SIGHUP; a divergence with no checkpoint; a FIFO for a checkpoint

@pytest.mark.slow
def test_ctrl_c_during_an_evaluation_stops_between_its_batches_and_resume_evaluates_again(corpus, tmp_path,
                                                                                        monkeypatch):
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["--max_iters=6", "--eval_interval=3", "--eval_iters=20", "--dropout=0.1"]
    assert train.main(flags_of(corpus, whole, *common)) == 0
    windows, drawn = data.windows, []

    def hooked(*args):
        if not torch.is_grad_enabled():  # an eval batch: training draws its batches with gradients on
            drawn.append(args)
            if len(drawn) == 20 + 20 + 5:  # the 5th batch of step 3's evaluation
                os.kill(os.getpid(), signal.SIGINT)
        return windows(*args)

    monkeypatch.setattr(data, "windows", hooked)
    assert train.main(flags_of(corpus, split, *common)) == 130
    assert len(drawn) == 45  # not the 40 - 5 batches left
    assert torch.load(split / "ckpt.pt", weights_only=True)["step"] == 3
    assert steps(split, "eval") == [0]
    monkeypatch.undo()
    assert train.main(flags_of(corpus, split, *common, "--resume")) == 0
    assert [(e["event"], e["step"], e.get("val_loss")) for e in events(split) if e["event"] != "interrupted"] == \
        [(e["event"], e["step"], e.get("val_loss")) for e in events(whole)]


def test_a_second_ctrl_c_during_an_evaluation_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    windows, drawn = data.windows, []

    def hooked(*args):
        if not torch.is_grad_enabled():  # an eval batch
            drawn.append(args)
            if len(drawn) == 2:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
        return windows(*args)

    monkeypatch.setattr(data, "windows", hooked)
    assert train.main(flags_of(corpus, tmp_path / "out", "--max_iters=4", "--eval_interval=2")) == 130
    err = capsys.readouterr().err
    assert err == "train.py: stopped at once by a second Ctrl-C; the checkpoints written so far are kept\n"


@pytest.mark.slow
def test_sighup_stops_a_run_with_a_checkpoint(corpus, tmp_path):
    out = tmp_path / "out"
    process = start(flags_of(corpus, out, "--max_iters=100000", "--eval_interval=1000"))
    try:
        wait_for(process, "step 3 |")
        process.send_signal(signal.SIGHUP)
        output = process.communicate(timeout=120)[0]
    finally:
        process.kill()
    assert process.returncode == 130, output
    interrupted = [e["step"] for e in events(out) if e["event"] == "interrupted"]
    assert interrupted == [torch.load(out / "ckpt.pt", weights_only=True)["step"]]


@pytest.mark.slow
@pytest.mark.parametrize("closed, buffered", [("stdout", False), ("stdout", True), ("stdout and stderr", False)])
def test_a_closed_pipe_stops_a_run_with_a_checkpoint_as_sighup_does(corpus, tmp_path, closed, buffered):
    """Issue 55: `python train.py ... | head -3` died of SIGPIPE at its next line, exit 141, with no checkpoint and no
    interrupted event. The reader here goes away after three lines, as head's does; buffered: without
    PYTHONUNBUFFERED, where a pipe's output was written 8 KB at a time."""
    out = tmp_path / "out"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen([sys.executable, "train.py", *flags_of(corpus, out, "--max_iters=100000",
                                                                      "--eval_interval=1000")],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               stderr=subprocess.PIPE if closed == "stdout" else subprocess.STDOUT,
                               env={**env, "OMP_NUM_THREADS": "1", **({} if buffered else {"PYTHONUNBUFFERED": "1"})})
    try:
        for _ in range(3):
            process.stdout.readline()
        process.stdout.close()
        err = process.stderr.read() if process.stderr else ""
        process.wait(timeout=600)  # a loaded machine takes minutes
    finally:
        process.kill()
    assert process.returncode == 130, err
    if closed == "stdout":
        one_line(err, "train.py: its output's reader went away (a closed pipe or terminal); the run stops after this "
                      "step with a checkpoint, as for SIGHUP")
    interrupted = [e["step"] for e in events(out) if e["event"] == "interrupted"]
    assert interrupted == [torch.load(out / "ckpt.pt", weights_only=True)["step"]]
    assert interrupted[0] > 0 and steps(out)[-1] == interrupted[0]


def test_an_output_whose_reader_went_away_drops_what_follows_and_calls_lost_once():
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = io.TextIOWrapper(io.FileIO(write_end, "w"))  # 8 KB buffered, as stdout into a pipe
    lost = []
    output = signals.Output(stream, lambda: lost.append(True))
    assert stream.line_buffering  # a line is written as printed, so that a reader gone is seen at the next line
    print("step 1", file=output)
    assert lost == [True]
    print("step 2", file=output, flush=True)
    output.flush()
    assert lost == [True] and os.path.samestat(os.fstat(write_end), os.stat(os.devnull))
    stream.close()


def test_a_divergence_before_the_first_checkpoint_says_there_is_none(corpus, tmp_path, monkeypatch, capsys):
    forward = model.GPT.forward
    monkeypatch.setattr(model.GPT, "forward", lambda self, idx, targets=None: (
        lambda logits, loss: (logits, loss * float("nan")))(*forward(self, idx, targets)))
    assert train.main(flags_of(corpus, tmp_path / "out", "--max_iters=4", "--eval_interval=2")) == 3
    printed = capsys.readouterr().out
    assert "there is no checkpoint: it diverged before the first" in printed and "is kept" not in printed
    assert not (tmp_path / "out" / "ckpt.pt").exists()


@pytest.mark.slow
def test_a_fifo_in_place_of_ckpt_pt_is_refused_and_an_older_checkpoint_resumes(corpus, checkpointed):
    (checkpointed / "ckpt.pt").unlink()
    (checkpointed / "ckpt-4.pt").unlink()
    os.mkfifo(checkpointed / "ckpt.pt")
    done = train_process(*flags_of(corpus, checkpointed, "--resume", "--max_iters=6"), timeout=120)  # a hang fails
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"train.py: note: cannot read {checkpointed / 'ckpt.pt'}: it is not a regular "
                                        "file (a FIFO, socket or device, which could block a read forever); resuming "
                                        f"from {checkpointed / 'ckpt-2.pt'}", resumed_line(2, 6, 4)]
    assert steps(checkpointed) == [1, 2, 3, 4, 5, 6]


# Bad input under a real 2-process torchrun

@pytest.mark.parametrize("bad, says", [("--lr=0", "--lr=0.0 must be in [1e-07, 1000]"),
                                       ("--block_size=100000", "too few for --block_size=100000")])
@pytest.mark.slow
def test_bad_input_under_torchrun_is_one_line_from_process_0_and_exit_code_2_on_every_process(corpus, tmp_path, bad,
                                                                                              says):
    out = tmp_path / "out"
    result = torchrun(2, *flags_of(corpus, out, bad))
    ours = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("train.py: ")]
    assert len(ours) == 1 and says in ours[0], result.stderr
    # what torchrun itself adds when a worker exits with a code other than 0 (docs/guarantees.md): its exit code 1,
    # a log line as it stops the others, and its ChildFailedError block, here listing every process with exit code 2
    # and none as killed by a signal
    assert result.returncode == 1
    assert result.stderr.count("exitcode  : 2") == 2 and "(SIGTERM)" not in result.stderr, result.stderr
    assert 'File "' + os.path.join(ROOT, "train.py") not in result.stderr  # no traceback of a worker
    assert not out.exists()


FAILING_LOG = """
import errno, os, sys
sys.path.insert(0, {here!r})
from engine import files
import train
real, calls = files.append_line, [0]


def append_line(path, line):  # process 0's fifth log line meets a full disk
    calls[0] += 1
    if os.environ["RANK"] == "0" and calls[0] > 4 and path.endswith("log.jsonl"):
        raise files.cannot_write(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    return real(path, line)


files.append_line = append_line
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_log_write_that_fails_mid_run_under_torchrun_is_one_line_per_process_and_no_traceback(corpus, tmp_path):
    """Process 0 cannot append a log line mid-run: it prints its one line and stops; process 1, left in the step's
    all-reduce, says in one line that another process stopped, instead of gloo's traceback."""
    script = tmp_path / "failing_log.py"
    script.write_text(FAILING_LOG.format(here=ROOT))
    out = tmp_path / "out"
    result = torchrun(2, *flags_of(corpus, out, "--max_iters=20", "--eval_interval=10"), script=script)
    ours = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("train.py: ")]
    assert len(ours) == 2, result.stderr
    assert f"cannot write {out / 'log.jsonl'} (No space left on device)" in ours[0]
    assert "process 1: another process of the run stopped" in ours[1]
    assert "[rank1]: Traceback" not in result.stderr and "Connection closed by peer" not in result.stderr, result.stderr
    assert run_reader.read_log(str(out / "log.jsonl"))[1] == ""  # whole lines only


def test_prepared_data_with_a_token_id_past_the_vocabulary_is_refused_before_anything_is_written(tmp_path, capsys):
    text = tmp_path / "ids.txt"
    text.write_text("a corpus whose prepared ids get damaged\n" * 50)
    folder = data.prepare(str(text), data_dir=str(tmp_path / "data"))
    tokens = np.fromfile(os.path.join(folder, "val.bin"), dtype=np.uint16)
    tokens[3] = 300  # the byte tokenizer's ids are 0..255; the model's padded vocabulary (320) would embed it
    tokens.tofile(os.path.join(folder, "val.bin"))
    assert train.main(flags_of(str(text), tmp_path / "out", "--max_iters=2")) == 2
    one_line(capsys.readouterr().err, "val.bin holds token id 300, but the vocabulary has 256")
    assert not (tmp_path / "out").exists()


# Files judged by what they are: nanonorm opens its own files (run.lock, log.jsonl, a checkpoint's temporary file, a
# prepared folder's lock and meta.json, a sweep's <seed>.out and config.json) only as regular files, never through a
# symlink and never waiting on a FIFO; anything else is one line, exit code 2, and is left as it is.

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
    "log.jsonl (read)": ("log.jsonl", lambda folder: run_reader.read_log(str(folder / "log.jsonl"))),
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


def one_line_of(err, script, *pieces):
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
    one_line_of(capsys.readouterr().err, "train.py", f"{out / 'run.lock'} is a symlink to")
    assert (tmp_path / "important.txt").read_text() == "keep\n"
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]


def test_train_refuses_a_fifo_at_run_lock_at_once(corpus, tmp_path, capsys, no_hang):
    out = tmp_path / "O"
    out.mkdir()
    os.mkfifo(out / "run.lock")
    assert train.main(train_argv(corpus, prepared(corpus), str(out), *TINY, "--max_iters=2")) == 2
    one_line_of(capsys.readouterr().err, "train.py", f"{out / 'run.lock'} is not a regular file")
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
    one_line_of(capsys.readouterr().err, "sweep.py", f"{runs / name} is not a regular file")
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

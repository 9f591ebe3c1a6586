"""The environment is input too: the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the
rendezvous address) are checked against each other before anything is written, by train.py and by every command
that reads them (sweep.py, whose runs inherit them; bench and the coord check); a bad set is one line, exit code 2.
A rendezvous whose peer never comes waits --rendezvous_timeout, and a stop signal ends the wait; a Ctrl-C while a
script starts is one line and exit code 130, at any moment."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import sweep
import train
from engine import runtime
from lab import bench, coord_check
from conftest import ROOT, SWEEP_TINY, prepared, tiny, train_argv

TINY = tiny(max_iters=2, eval_interval=2)  # a run that ends at once, had a bad environment been let through
# what torchrun sets in process 1 of a run of 2 processes on one node
TORCHRUN = dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                MASTER_PORT="29500")
VARIABLES = (*runtime.COUNTS, *runtime.RENDEZVOUS)

# (the environment, a piece of the message)
BAD_ENV = [
    (dict(RANK="abc"), "RANK=abc in the environment is not an integer >= 0"),
    (dict(WORLD_SIZE="notanumber"), "WORLD_SIZE=notanumber in the environment is not an integer >= 0"),
    (dict(RANK="-1"), "RANK=-1 in the environment is not an integer >= 0"),
    (dict(LOCAL_RANK="1e3"), "LOCAL_RANK=1e3 in the environment is not an integer >= 0"),
    (dict(WORLD_SIZE="0"), "WORLD_SIZE=0 in the environment: a run has at least one process"),
    (dict(LOCAL_WORLD_SIZE="0"), "LOCAL_WORLD_SIZE=0 in the environment: a run has at least one process"),
    (dict(WORLD_SIZE="2"), "WORLD_SIZE=2 is set in the environment but RANK is not"),
    (dict(LOCAL_RANK="1"), "LOCAL_RANK=1 is set in the environment but RANK is not"),
    (dict(RANK="0", WORLD_SIZE="1"), "RANK=0 is set in the environment but LOCAL_RANK is not"),
    ({**TORCHRUN, "MASTER_PORT": None}, "RANK=1 is set in the environment but MASTER_PORT is not"),
    ({**TORCHRUN, "RANK": "2"}, "RANK=2 with WORLD_SIZE=2 in the environment: a RANK goes from 0 to WORLD_SIZE - 1"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2 in the environment"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE=4 with WORLD_SIZE=2 in the environment"),
    # issue 46: each was a torch traceback from the rendezvous
    ({**TORCHRUN, "MASTER_PORT": "abc"}, "MASTER_PORT=abc in the environment is not a TCP port (an integer from 1 to "
     "65535)"),
    ({**TORCHRUN, "MASTER_PORT": "99999"}, "MASTER_PORT=99999 in the environment is not a TCP port"),
    ({**TORCHRUN, "MASTER_PORT": "0"}, "MASTER_PORT=0 in the environment is not a TCP port"),
    ({**TORCHRUN, "MASTER_ADDR": ""}, "MASTER_ADDR is empty in the environment"),
]
IDS = [" ".join(f"{k}={v}" for k, v in env.items()) for env, _ in BAD_ENV]


def set_env(monkeypatch, env):
    """Exactly env's torchrun variables in the environment (None: unset), whatever the tests run under."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)


def one_line(err, script, expected):
    assert err.count("\n") == 1 and err.startswith(f"{script}: ") and "Traceback" not in err, err
    assert expected in err, (expected, err)


@pytest.mark.parametrize("env, expected", BAD_ENV, ids=IDS)
def test_train_refuses_a_bad_environment_in_one_line_before_writing(corpus, tmp_path, capsys, monkeypatch, env,
                                                                     expected):
    set_env(monkeypatch, env)
    assert train.main(train_argv(corpus, prepared(corpus), str(tmp_path / "out"), *TINY)) == 2
    one_line(capsys.readouterr().err, "train.py", expected)
    assert not (tmp_path / "out").exists()


def test_what_torchrun_sets_and_no_torchrun_at_all_are_taken(monkeypatch):
    set_env(monkeypatch, TORCHRUN)
    machine = runtime.Machine.from_env()
    assert (machine.ddp, machine.rank, machine.local_rank, machine.world_size, machine.local_world_size) == \
        (True, 1, 1, 2, 2)
    set_env(monkeypatch, dict(RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", MASTER_ADDR="node0",
                              MASTER_PORT="29500"))  # process 5 of 8, on the second of two nodes
    assert runtime.Machine.from_env().rank == 5
    set_env(monkeypatch, {})
    assert runtime.Machine.from_env() == runtime.Machine()
    set_env(monkeypatch, dict(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", LOCAL_RANK="0"))  # one process's values
    assert runtime.Machine.from_env() == runtime.Machine()


def test_sweep_bench_and_the_coord_check_refuse_a_bad_environment(corpus, tmp_path, capsys, monkeypatch):
    set_env(monkeypatch, dict(WORLD_SIZE="2"))
    expected = "WORLD_SIZE=2 is set in the environment but RANK is not"
    argv = [f"--dataset={corpus}", f"--data_dir={prepared(corpus)}", f"--out_dir={tmp_path / 'S'}",
            "--variants=baseline", "--lrs=1e-2", "--seeds=1", *SWEEP_TINY]
    assert sweep.main(argv) == 2
    one_line(capsys.readouterr().err, "sweep.py", expected)
    assert bench.main(["--variants=baseline", "--rounds=1", "--n_layer=1", "--n_embd=16", "--n_head=2",
                       "--block_size=8", "--batch_size=2", "--vocab_size=64"]) == 2
    one_line(capsys.readouterr().err, "bench.py", expected)
    assert coord_check.main([f"--dataset={corpus}", f"--data_dir={tmp_path / 'data'}", "--widths=16", "--steps=1",
                             "--n_layer=1", "--batch_size=2", f"--out={tmp_path / 'cc.png'}"]) == 2
    one_line(capsys.readouterr().err, "coord_check.py", expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no sweep folder, no prepared data, no figure


@pytest.mark.slow
def test_world_size_2_without_torchrun_writes_nothing_and_the_same_command_says_the_same(corpus, tmp_path):
    """WORLD_SIZE=2 python train.py ...: once logged a halved val loss, crashed at its first checkpoint and left files
    that made the same command a run the folder "holds"."""
    argv = train_argv(corpus, prepared(corpus), str(tmp_path / "out"), *TINY)
    env = {name: value for name, value in os.environ.items() if name not in VARIABLES}
    for _ in range(2):
        result = subprocess.run([sys.executable, "train.py", *argv], capture_output=True, text=True, cwd=ROOT,
                                timeout=120, env={**env, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2"})
        assert result.returncode == 2
        one_line(result.stderr, "train.py", "WORLD_SIZE=2 is set in the environment but RANK is not")
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train.py", "sweep.py", "sample.py"])
def test_a_ctrl_c_while_torch_imports_is_one_line_and_130(tmp_path, script):
    """Issue 46: a Ctrl-C in the first seconds (while torch imports) printed a KeyboardInterrupt traceback and exited
    with -2. A stand-in torch sends the Ctrl-C from inside its import, every time."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (130, f"{script}: stopped by Ctrl-C while starting; nothing was written\n")


@pytest.mark.parametrize("script", ["sweep.py", "train.py"])
def test_a_closed_pipe_ends_the_script_quietly(script, tmp_path):
    """`python sweep.py --recipe=... --dry_run | head -1` printed a BrokenPipeError traceback: the reader that went
    away is no error of the command's."""
    argv = (["--recipe=normformer_lr", "--dry_run", f"--out_dir={tmp_path}"] if script == "sweep.py" else ["--help"])
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the script prints, as `head -1` has once it has its line
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), *argv], stdout=write_end,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
    os.close(write_end)
    assert done.stderr == ""


def fake_torch(tmp_path, source, module="torch"):
    """PYTHONPATH for a subprocess whose `import torch` (or of another module) runs source."""
    fake = tmp_path / "fake" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(source)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}


def default_ctrl_c():
    """SIGINT's default action in a child: a suite started in the background by a shell without job control ignores
    SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("script, module", [("train.py", "torch"), ("sweep.py", "torch"), ("sample.py", "torch"),
                                            ("data.py", "numpy"), ("plot.py", "numpy")])
def test_a_ctrl_c_inside_an_import_that_catches_everything_still_stops_at_once(tmp_path, script, module):
    """Issue 55: the handler raised SystemExit inside whatever was importing, and the C extensions torch imports catch
    what the Python code they call raises: pybind11 aborted the process, numpy was left half-loaded (a traceback
    ending in "cannot load module more than once per process", exit 1), or the run trained on to the end, exit 0. A
    stand-in torch (numpy for data.py and plot.py, which do not import torch) catches everything, as they do."""
    env = fake_torch(tmp_path, "import os, signal, time\ntry:\n    os.kill(os.getpid(), signal.SIGINT)\n"
                               "    time.sleep(30)\nexcept BaseException:\n    pass\n", module)
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, preexec_fn=default_ctrl_c)
    assert (done.returncode, done.stderr) == (130, f"{script}: stopped by Ctrl-C while starting; nothing was written\n")


def test_a_ctrl_c_in_plots_work_is_one_line_and_130(monkeypatch, capsys):
    """plot.py's own handling of Ctrl-C, once starting's has ended: one line, exit code 130, not a traceback."""
    import plot

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(plot, "parse_args", interrupted)
    assert plot.main(["runs"]) == 130
    assert capsys.readouterr().err == ("plot.py: stopped by Ctrl-C; each file written before is whole, the one being "
                                       "written is as it was\n")


# Runs train.py as `python train.py` does (its file is __main__'s), after a line on stdout: a Ctrl-C sent after that
# line reaches the script itself, not the interpreter's own start, before which no script can say anything.
AS_MAIN = """
import runpy, sys
sys.argv = sys.argv[1:]
print("starting", flush=True)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# The same, where reading torchrun's environment, the first thing train.main does before its own handling of Ctrl-C
# begins, gets a Ctrl-C
CTRL_C_IN_MAIN = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
from engine import runtime
def from_env():
    os.kill(os.getpid(), signal.SIGINT)
    return runtime.Machine()
runtime.Machine.from_env = from_env
runpy.run_path(os.path.join({root!r}, "train.py"), run_name="__main__")
"""


@pytest.mark.slow
def test_a_ctrl_c_between_the_imports_and_mains_own_handling_is_one_line_and_130(tmp_path):
    """Issue 55: once the script had defined main(), the handler raised KeyboardInterrupt, which nothing caught
    before main's try: a traceback."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_MAIN.format(root=ROOT)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, preexec_fn=default_ctrl_c)
    assert (done.returncode, done.stderr) == (130, "train.py: stopped by Ctrl-C while starting; nothing was written\n")


STOPPED_AT = ("train.py: stopped by Ctrl-C while starting; nothing was written",
              "train.py: stopped by Ctrl-C before training began; prepared data is complete or absent")


def ctrl_c_after(delay, argv):
    """train.py argv, as `python train.py` runs it, sent a real Ctrl-C delay seconds after its first line (None: no
    Ctrl-C): (exit code, stdout, stderr, seconds from its first line to its end)."""
    process = subprocess.Popen([sys.executable, "-c", AS_MAIN, "train.py", *argv], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_ctrl_c,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert process.stdout.readline() == "starting\n"
        started = time.perf_counter()
        if delay is not None:
            time.sleep(delay)
            process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=900)
    finally:
        process.kill()
    return process.returncode, out, err, time.perf_counter() - started


STOPPED = ("train.py: stopped by Ctrl-C while starting; nothing was written\n",
           "train.py: stopped by Ctrl-C before training began; prepared data is complete or absent\n")


@pytest.mark.slow
def test_a_real_ctrl_c_at_any_moment_of_the_start_is_one_line_and_130(corpus, tmp_path):
    """Issue 55: a real Ctrl-C at 0.35 s gave a traceback through `import torch` and exit 1; at 0.45 s no line, and
    the run trained to the end (exit 0). Here real Ctrl-Cs at 16 moments, from the script's first line through its
    imports (timed first, as `--help` takes them) to its checks and first steps: each stops it with exit code 130 and
    one line on stderr, or, once training has begun, with a checkpoint and the `interrupted` line on stdout; never a
    traceback, and where the line says nothing was written, nothing was."""
    imports = ctrl_c_after(None, ["--help"])[3]
    for i in range(16):
        delay = imports * 1.25 * (i + 1) / 16
        folder = tmp_path / f"out{i}"
        code, out, err, _ = ctrl_c_after(delay, train_argv(corpus, prepared(corpus), str(folder), *TINY,
                                                           "--max_iters=100000", "--eval_interval=1000"))
        said = f"Ctrl-C at {delay:.2f} s: exit code {code}, stderr {err!r}"
        assert code == 130 and (err in STOPPED or (err == "" and "interrupted at step" in out)), said
        assert not (err == STOPPED[0] and folder.exists()), said


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether a socket on this machine listens on port (Linux's /proc/net/tcp: process 0's store, once it waits)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        if any(row[3] == "0A" and int(row[1].rsplit(":", 1)[1], 16) == port for row in rows):  # 0A: LISTEN
            return True
    return False


def alone(rank, port):
    """The environment of process rank of a 2-process run whose other process never comes."""
    return {**os.environ, **TORCHRUN, "RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_a_process_whose_peer_never_comes_waits_the_rendezvous_timeout_then_says_so(corpus, tmp_path, rank):
    """Issue 55: `RANK=0 WORLD_SIZE=2 ... python train.py` printed nothing and waited (torch's 30 minutes). Process 0
    says one line; another process's line comes last, after torch's own log of its failed connections."""
    argv = train_argv(corpus, prepared(corpus), str(tmp_path / "out"), *TINY, "--rendezvous_timeout=2")
    done = subprocess.run([sys.executable, "train.py", *argv], env=alone(rank, free_port()), capture_output=True,
                          text=True, cwd=ROOT, timeout=900)
    said = f"train.py: process {rank} of WORLD_SIZE=2 could not join the run's processes at 127.0.0.1:"
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(said), done.stderr
    assert "or give them more than --rendezvous_timeout=2 seconds" in done.stderr
    if rank == 0:
        one_line(done.stderr, "train.py", said)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_ends_the_wait_for_a_peer_at_once_in_one_line(corpus, tmp_path, sig):
    """Issue 55: SIGTERM, from `timeout` or by hand, had no effect on a process waiting for its peer: Python's handlers
    cannot run while torch's C++ rendezvous blocks the main thread. Only SIGKILL ended it."""
    port = free_port()
    argv = train_argv(corpus, prepared(corpus), str(tmp_path / "out"), *TINY)
    process = subprocess.Popen([sys.executable, "train.py", *argv], env=alone(0, port), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=default_ctrl_c)
    try:
        deadline = time.time() + 900
        while not listening(port) and process.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert listening(port), process.poll()  # process 0 waits for process 1
        process.send_signal(sig)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    name = "Ctrl-C" if sig == signal.SIGINT else sig.name
    assert (process.returncode, out, err) == (128 + sig, "", f"train.py: stopped by {name} while waiting for the run's "
                                              "other processes to join; nothing of the run was written\n")
    assert not (tmp_path / "out").exists()

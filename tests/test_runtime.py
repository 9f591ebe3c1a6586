"""The environment is input too: the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the
rendezvous address) are checked against each other before anything is written, by train.py and by every command
that reads them (sweep.py, whose runs inherit them; bench and the coord check); a bad set is one line, exit code 2."""

import os
import subprocess
import sys

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

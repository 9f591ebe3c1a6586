"""lab/pool.py's share of the machine for each job, checked with made-up machines (16 cores and one GPU, two
GPUs, more jobs than cores, an OS that cannot pin), and its warm-first start on a GPU with stand-in runs; a sweep
whose output's reader goes away stops its runs as for SIGHUP."""
import io
import os
import signal
import sys
import time

import pytest
import torch

from lab import pool
from lab.runs import OUTPUT_LOST, Run

ONE_GPU_16_CORES = pool.Machine(cores=list(range(100, 116)), count=16, gpus=["0"])


def shares(jobs, machine, environ=None):
    return [pool.job_env(slot, jobs, machine, environ or {}) for slot in range(jobs)]


@pytest.mark.parametrize("jobs,share", [(1, 16), (2, 8), (3, 5), (4, 4), (16, 1)])
def test_jobs_on_one_gpu_each_get_their_own_cores_and_as_many_threads(jobs, share):
    planned = shares(jobs, ONE_GPU_16_CORES)
    used = [core for _, cores in planned for core in cores]
    # no core is given twice, and no job runs more threads (torch's, the compiler's) than the cores it holds
    assert len(used) == len(set(used)) == jobs * share and set(used) <= set(ONE_GPU_16_CORES.cores)
    for env, cores in planned:
        assert env["OMP_NUM_THREADS"] == env["TORCHINDUCTOR_COMPILE_THREADS"] == str(share) == str(len(cores))
        assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_more_jobs_than_cores_take_the_cores_in_turn_with_one_thread_each():
    planned = shares(5, pool.Machine(cores=[0, 1], count=2, gpus=[]))
    assert [cores for _, cores in planned] == [{0}, {1}, {0}, {1}, {0}]
    assert all(env["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in env for env, _ in planned)


def test_jobs_take_the_visible_gpus_in_turn_and_every_job_shares_one_compile_cache():
    planned = shares(4, pool.Machine(cores=list(range(8)), count=8, gpus=["2", "3"]))
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in planned] == ["2", "3", "2", "3"]
    assert len({env["TORCHINDUCTOR_CACHE_DIR"] for env, _ in planned}) == 1
    given = shares(2, ONE_GPU_16_CORES, {"TORCHINDUCTOR_CACHE_DIR": "/shared/cache"})
    assert [env["TORCHINDUCTOR_CACHE_DIR"] for env, _ in given] == ["/shared/cache"] * 2


def test_where_the_os_cannot_pin_each_job_still_gets_its_share_of_threads():
    planned = shares(4, pool.Machine(cores=None, count=8, gpus=[]))
    assert all(cores is None and env["OMP_NUM_THREADS"] == "2" for env, cores in planned)


def test_the_machine_names_its_gpus_as_the_jobs_see_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pool.Machine.here({}).gpus == ["0", "1"]
    assert pool.Machine.here({"CUDA_VISIBLE_DEVICES": "5, 7"}).gpus == ["5", "7"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pool.Machine.here({}).gpus == []


def stand_in(run, log_of_first, marker_of_other):
    """A run's process: it records whether the first run of its variant had compiled when it started (its log held
    a training step); the first run itself waits for the other variant's run to start, then logs a training step."""
    script = (
        "import json, os, sys, time\n"
        "os.makedirs(sys.argv[1], exist_ok=True)\n"
        "compiled = os.path.exists(sys.argv[2]) and 'train' in open(sys.argv[2]).read()\n"
        "open(os.path.join(sys.argv[1], 'started'), 'w').write(str(compiled))\n"
        "if sys.argv[1] == os.path.dirname(sys.argv[2]):\n"
        "    for _ in range(600):\n"
        "        if os.path.exists(sys.argv[3]):\n"
        "            break\n"
        "        time.sleep(0.05)\n"
        "    open(sys.argv[2], 'w').write(json.dumps({'event': 'train', 'step': 10}) + '\\n')\n"
        "    time.sleep(0.5)\n")
    return [sys.executable, "-c", script, run.dir, log_of_first, marker_of_other]


def test_on_a_gpu_a_variants_later_runs_start_once_its_first_has_compiled(tmp_path, monkeypatch):
    monkeypatch.setattr(pool.Machine, "here", classmethod(lambda cls: pool.Machine(None, 3, ["0"])))
    runs = [Run("a", "1e-3", 0, str(tmp_path / "a" / "0")), Run("a", "1e-3", 1, str(tmp_path / "a" / "1")),
            Run("b", "1e-3", 0, str(tmp_path / "b" / "0"))]
    first_log, other_started = os.path.join(runs[0].dir, "log.jsonl"), os.path.join(runs[2].dir, "started")
    pool.run_jobs(runs, 3, lambda run: stand_in(run, first_log, other_started))
    started = {run.dir: open(os.path.join(run.dir, "started")).read() for run in runs}
    # b's first run compiled beside a's; a's second waited for a's first to get past its compile
    assert started == {runs[0].dir: "False", runs[1].dir: "True", runs[2].dir: "False"}
    assert all(open(run.dir + ".exit").read() == "0\n" for run in runs)


# A run's process that waits to be stopped: SIGHUP recorded in its folder, then the exit code train.py gives a stop
WAITS_FOR_A_STOP = (
    "import os, signal, sys, time\n"
    "def stopped(signum, frame):\n"
    "    open(os.path.join(sys.argv[1], 'stopped'), 'w').write(signal.Signals(signum).name)\n"
    "    os._exit(130)\n"
    "os.makedirs(sys.argv[1], exist_ok=True)\n"
    "signal.signal(signal.SIGHUP, stopped)\n"
    "open(os.path.join(sys.argv[1], 'started'), 'w').close()\n"
    "time.sleep(120)\n")


class ReaderGoesAway(io.TextIOWrapper):
    """stdout into a pipe whose reader goes away once the first run has started (as `| head -2` does, here by
    closing the read end): the next "start" line meets EPIPE, as a write to a closed pipe does with SIGPIPE
    ignored."""

    def __init__(self, first_started):
        self.read_end, write_end = os.pipe()
        super().__init__(io.FileIO(write_end, "w"), line_buffering=True)
        self.first_started, self.starts = first_started, 0

    def write(self, text):
        self.starts += text.startswith("start")
        if self.starts == 2 and self.read_end is not None:
            deadline = time.time() + 60
            while not os.path.exists(self.first_started) and time.time() < deadline:
                time.sleep(0.05)
            os.close(self.read_end)
            self.read_end = None
        return super().write(text)


def test_a_sweep_whose_output_goes_away_stops_its_runs_as_for_sighup(tmp_path, monkeypatch, capsys):
    """Issue 55: `python sweep.py ... | head -2` died of SIGPIPE at its next line, its runs left running without it
    and no summary or line. Now the first line that meets the closed pipe stops the sweep as a SIGHUP does: the
    running runs are sent SIGHUP (train.py writes a checkpoint and exits 130) and waited for, nothing more starts,
    and run_all returns SIGHUP, which sweep.py reports in one line and exit code 129."""
    monkeypatch.setattr(pool.Machine, "here", classmethod(lambda cls: pool.Machine(None, 2, [])))
    runs = [Run("a", "1e-3", seed, str(tmp_path / "a" / str(seed))) for seed in (0, 1)]
    stdout = ReaderGoesAway(os.path.join(runs[0].dir, "started"))
    monkeypatch.setattr(sys, "stdout", stdout)
    stopped = pool.run_all(runs, 2, lambda run: [sys.executable, "-c", WAITS_FOR_A_STOP, run.dir])
    assert sys.stdout is stdout  # put back as it was
    assert stopped == signal.SIGHUP
    assert open(os.path.join(runs[0].dir, "stopped")).read() == "SIGHUP"
    assert open(runs[0].dir + ".exit").read() == "130\n"
    assert not os.path.exists(os.path.join(runs[1].dir, "started"))
    assert capsys.readouterr().err == OUTPUT_LOST + "\n"
    stdout.close()

"""
sweep.py's runs as train.py processes, --jobs at a time, each with its share of the machine (one GPU, or its CPU
cores), its console output in <seed>.out and its exit code in <seed>.exit beside its folder. A Ctrl-C, SIGTERM or
SIGHUP to sweep.py is passed on to the running processes, which stop with a checkpoint; the pool waits for them and
starts nothing more.
"""

import contextlib
import functools
import io
import os
import signal
import subprocess
import time
from dataclasses import dataclass

import torch

from engine import files
from engine import runtime
from engine import signals
from engine.files import WriteError
from lab.runs import Run, is_finished


def job_env(slot, jobs):
    """One GPU per job where there are GPUs; otherwise the job's share of the CPU cores (and their ids)."""
    env = dict(os.environ)
    if torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = str(slot % torch.cuda.device_count())
        return env, None
    share = max(1, runtime.cpu_cores() // jobs)
    env["OMP_NUM_THREADS"] = str(share)
    if not hasattr(os, "sched_getaffinity"):  # macOS: no pinning
        return env, None
    cores = sorted(os.sched_getaffinity(0))
    return env, {cores[(slot * share + i) % len(cores)] for i in range(share)}


@dataclass
class Job:
    """A train.py process the sweep started: its run, the slot (CPU cores or GPU) it holds and its console file."""
    run: Run
    slot: int
    process: subprocess.Popen
    out: io.TextIOWrapper


def why_not_start(run):
    """Why a run must not start now (None if it may): another process holds its folder (a sweep started twice, or a
    run from --dry_run's commands) or it finished meanwhile (another sweep ran it)."""
    holder = files.held_by(run.dir)
    if holder:
        return f"running in another process ({holder}); left to it"
    return "finished meanwhile" if is_finished(run) else None


def start(run, command, slot, jobs):
    """One train.py process (command: its argv) in a session of its own, so that a Ctrl-C in the terminal reaches
    sweep.py alone, which passes it on once (train.py stops at once on a second one). train.py takes its thread count
    from the cores it is pinned to."""
    env, cores = job_env(slot, jobs)
    try:
        os.makedirs(os.path.dirname(run.dir), exist_ok=True)
        out = open(run.dir + ".out", "a", opener=files.open_own)  # a FIFO or a link there is refused, not waited on
    except OSError as e:
        raise files.cannot_write(run.dir + ".out", e) from None
    print(f"start {run.dir}{' (resume)' if '--resume' in command else ''}", flush=True)
    try:
        process = subprocess.Popen(command, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   preexec_fn=functools.partial(os.sched_setaffinity, 0, cores) if cores else None)
    except BaseException:
        out.close()
        raise
    return Job(run, slot, process, out)


def finish(job):
    """Record the exit code of an ended job beside its folder (<seed>.exit)."""
    job.out.close()
    code = job.process.returncode
    files.write_atomic(job.run.dir + ".exit", f"{code}\n".encode())
    print(f"exit {code} {job.run.dir}", flush=True)


def run_all(runs, jobs, command):
    """Every run, jobs at a time (command(run): the argv of its train.py process). None once all have ended, or
    the signal that stopped the sweep (SIGINT for a Ctrl-C) once the runs it stopped have ended."""
    handlers = signals.stop_on_signals()
    try:
        run_jobs(runs, jobs, command)
    except KeyboardInterrupt as stop:
        return signals.signum(stop)
    finally:
        signals.restore(handlers)
    return None


def run_jobs(runs, count, command):
    """Every run, count at a time. A Ctrl-C, SIGTERM or SIGHUP to sweep.py is passed on to the running train.py
    processes, which write a checkpoint and stop; sweep.py waits for them, records their exit codes and re-raises,
    and starts nothing more."""
    pending, jobs, free = list(runs), [], list(range(count))
    try:
        while pending or jobs:
            while pending and free:
                run = pending.pop(0)
                why = why_not_start(run)
                if why:
                    print(f"skip {run.dir}: {why}", flush=True)
                    continue
                jobs.append(start(run, command(run), free.pop(0), count))
            for job in [job for job in jobs if job.process.poll() is not None]:
                jobs.remove(job)
                free.append(job.slot)
                finish(job)
            time.sleep(0.1)
    except BaseException as e:  # a signal, or a file sweep.py could not write: no run is left running
        stop_jobs(jobs, signals.signum(e) if isinstance(e, KeyboardInterrupt) else signal.SIGTERM)
        raise


def stop_jobs(jobs, signum):
    """Pass the signal on to every running job and wait for them all; a second Ctrl-C (or signal) meanwhile is
    passed on as a Ctrl-C, which train.py takes as "stop at once"."""
    for job in jobs:
        job.process.send_signal(signum)
    while jobs:
        try:
            jobs[0].process.wait()
            job = jobs.pop(0)
            with contextlib.suppress(WriteError):  # the error that stopped the sweep is the one to report
                finish(job)
        except KeyboardInterrupt:
            for job in jobs:
                job.process.send_signal(signal.SIGINT)

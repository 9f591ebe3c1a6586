"""
sweep.py's runs as train.py processes, --jobs at a time, each with its share of the machine, its console output in
<seed>.out and its exit code in <seed>.exit beside its folder. A Ctrl-C, SIGTERM or SIGHUP to sweep.py is passed on
to the running processes, which stop with a checkpoint; the pool waits for them and starts nothing more.

Each job's share: cores // jobs CPU cores, pinned, and as many threads (torch's and the compiler's), so that 16 jobs
on 16 cores run 16 threads, not 256; with GPUs, the GPUs in turn (job i on GPU i % GPUs), so --jobs=8 on one GPU
runs 8 runs on it at once. Every job compiles into one inductor cache (TORCHINDUCTOR_CACHE_DIR), and on a GPU the
later runs of a variant start once its first run has compiled (it has logged a training step, or ended): a shape
compiles once, and the others read it from the cache. docs/benchmarks.md says how to choose --jobs.
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
from torch._inductor.runtime import cache_dir_utils

from engine import files
from engine import run_reader
from engine import runtime
from engine import signals
from engine.files import WriteError
from lab.runs import OUTPUT_LOST, Run, is_finished


@dataclass
class Machine:
    """What the pool shares among its jobs: the CPU cores it may run on (None where the OS cannot pin: macOS), how
    many, and the GPUs as CUDA_VISIBLE_DEVICES names them for a child process ([] without CUDA)."""
    cores: list
    count: int
    gpus: list

    @classmethod
    def here(cls, environ=os.environ):
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        # a CUDA_VISIBLE_DEVICES of its own narrows the GPUs; a job's index is into that list, not the machine's
        listed = [name.strip() for name in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
        gpus = listed[:count] if listed else [str(i) for i in range(count)]
        return cls(cores, len(cores) if cores else runtime.cpu_cores(), gpus)


def job_env(slot, jobs, machine, environ=os.environ):
    """The environment and the pinned cores (None: not pinned) of the job in `slot` of `jobs`: cores // jobs cores
    (1 when jobs outnumber the cores, which then take them in turn), that many threads for torch (OMP_NUM_THREADS)
    and for inductor's compile workers, its GPU in turn, and the compile cache every job shares."""
    env = dict(environ)
    share = max(1, machine.count // jobs)
    env["OMP_NUM_THREADS"] = env["TORCHINDUCTOR_COMPILE_THREADS"] = str(share)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", cache_dir_utils.default_cache_dir())
    if machine.gpus:
        env["CUDA_VISIBLE_DEVICES"] = machine.gpus[slot % len(machine.gpus)]
    if machine.cores is None:
        return env, None
    return env, {machine.cores[(slot * share + i) % len(machine.cores)] for i in range(share)}


def compiled_once(run):
    """Whether the run has got past its compile: its log holds a training step (train.py logs one every
    --log_interval steps, after the evaluation and the first steps that compile)."""
    try:
        with open(run_reader.log_path(run.dir), encoding="utf-8", errors="replace") as f:
            return '"event": "train"' in f.read()
    except OSError:
        return False


def next_run(pending, warming):
    """The first pending run whose variant is not compiling in another job (warming: variant -> that job)."""
    return next((run for run in pending if run.variant not in warming), None)


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


def start(run, command, slot, jobs, machine):
    """One train.py process (command: its argv) in a session of its own, so that a Ctrl-C in the terminal reaches
    sweep.py alone, which passes it on once (train.py stops at once on a second one). train.py takes its thread count
    from the cores it is pinned to."""
    env, cores = job_env(slot, jobs, machine)
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
    output = signals.keep_output(functools.partial(signals.hang_up, OUTPUT_LOST))
    try:
        run_jobs(runs, jobs, command)
    except KeyboardInterrupt as stop:
        return signals.signum(stop)
    finally:
        signals.restore_output(output)
        signals.restore(handlers)
    return None


def run_jobs(runs, count, command):
    """Every run, count at a time. A Ctrl-C, SIGTERM or SIGHUP to sweep.py is passed on to the running train.py
    processes, which write a checkpoint and stop; sweep.py waits for them, records their exit codes and re-raises,
    and starts nothing more. On a GPU a variant's first run compiles alone (warming), its others wait for the cache."""
    pending, jobs, free = list(runs), [], list(range(count))
    machine = Machine.here()
    warming, warmed = {}, set()  # variant -> the job compiling it; the variants compiled
    try:
        while pending or jobs:
            run = next_run(pending, warming)
            while run and free:
                pending.remove(run)
                why = why_not_start(run)
                if why:
                    print(f"skip {run.dir}: {why}", flush=True)
                else:
                    jobs.append(start(run, command(run), free.pop(0), count, machine))
                    if machine.gpus and run.variant not in warmed:
                        warming[run.variant] = jobs[-1]
                        warmed.add(run.variant)
                run = next_run(pending, warming)
            for variant, job in list(warming.items()):
                if job.process.poll() is not None or compiled_once(job.run):
                    del warming[variant]
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

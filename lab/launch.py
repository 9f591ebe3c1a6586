"""
sweep.py's runs as jobs of a scheduler, through submitit (github.com/facebookincubator/submitit), as PyTorch research
code sends its runs to Slurm. --launcher=slurm submits one job per run, a sweep's runs as one job array (at most
--jobs running at once), with the cluster's flags (LaunchOptions); --launcher=local runs the same jobs through
submitit's local executor as processes of this machine, --jobs at a time (how the tests run this path). A job runs
train.py as lab/pool.py does: its console output in <seed>.out and its exit code in <seed>.exit beside the run's
folder, and the run in the same folder, so the summary, the results page and a re-run's skipping of finished runs
read it as they read the pool's, whatever machine ran it. submitit's own logs go to <out_dir>/.submitit/.

Preemption and time limits: Slurm signals a job (USR2) signal_delay_s before its end or when it is preempted;
submitit then calls TrainJob.checkpoint, which stops train.py with SIGTERM (it finishes its step, writes a checkpoint
and exits 130) and hands submitit the same job to requeue; the requeued job finds the checkpoint and resumes
(--resume, lab/runs.restart_flags). A run that needs more than MAX_TIMEOUTS time limits ends unfinished.

Each submitted run's job is recorded beside it (<seed>.job): a re-run of the sweep, or `--collect`, leaves a run whose
job is still queued or running to it (`queued`), and counts it apart from the runs that failed.
"""

import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Literal, Optional

from engine import files
from engine import signals
from engine.flags import UsageError, help_of
from lab.runs import OUTPUT_LOST, restart_flags

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(HERE, "train.py")
CLUSTER_FLAGS = ("partition", "time_min", "gpus_per_run", "cpus_per_run", "account", "qos", "sbatch")
MAX_TIMEOUTS = 20  # requeues at the time limit (preemptions are not counted: submitit requeues those without end)
SIGNAL_DELAY_S = 120  # how long before its end a job is told to stop: train.py's checkpoint must be written by then
# the states of a Slurm job that is waiting or running (sacct's JOB STATE CODES)
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "RESIZING",
          "SUSPENDED", "SIGNALING", "STAGE_OUT")
SBATCH_OPTION = re.compile(r"[a-z][a-z0-9-]*(=[^,]+)?")
POLL_S = {"slurm": 30.0, "local": 0.5}  # sacct is asked at most this often (submitit's watcher caches its answers)


@dataclass
class LaunchOptions:
    """Where sweep.py runs its runs (its flags; sweep.py --help lists them)."""
    launcher: Literal["pool", "slurm", "local"] = help_of(
        "pool: processes of this machine (lab/pool.py); slurm: a Slurm job per run, one array (submitit); local: "
        "submitit's jobs as processes here", default="pool")
    collect: bool = help_of("start nothing: summarize the runs that finished (jobs still queued are counted apart)",
                            default=False)
    partition: str = help_of("Slurm: the partition (sbatch --partition)", default="")
    time_min: int = help_of("slurm/local: each job's time limit in minutes; a run that needs longer is requeued and "
                            "resumes from its checkpoint", default=240)
    gpus_per_run: Optional[int] = help_of("slurm/local: GPUs per run, torchrun over them where more than 1 (None: 1 "
                                          "with --scale=gpu, else 0)", default=None)
    cpus_per_run: int = help_of("Slurm: CPU cores per run (sbatch --cpus-per-task)", default=8)
    account: str = help_of("Slurm: the account to charge (sbatch --account)", default="")
    qos: str = help_of("Slurm: the quality of service (sbatch --qos)", default="")
    sbatch: str = help_of("Slurm: more sbatch options, comma-separated: constraint=h100,mem=64G,exclusive",
                          default="")


def check(options, given, dry_run, scale):
    """LaunchOptions as the command line gave them (given: the flags it set), checked; gpus_per_run resolved for the
    scale. A cluster flag without a launcher that reads it, and Slurm where none is (but for --dry_run), are
    refused: nothing the command line says goes unread."""
    if options.collect and dry_run:
        raise UsageError("--collect summarizes and --dry_run prints commands; give one of them")
    if options.launcher == "pool":
        unread = [f"--{name}" for name in CLUSTER_FLAGS if name in given]
        if unread:
            raise UsageError(f"{', '.join(unread)} set a scheduler's jobs; add --launcher=slurm (or local), or leave "
                             "them out")
    elif options.launcher == "local":
        unread = [f"--{name}" for name in ("partition", "cpus_per_run", "account", "qos", "sbatch") if name in given]
        if unread:
            raise UsageError(f"{', '.join(unread)} are Slurm's; --launcher=local runs the jobs on this machine")
    if not 1 <= options.time_min <= 366 * 24 * 60:
        raise UsageError(f"--time_min={options.time_min} must be from 1 to {366 * 24 * 60} minutes")
    if options.gpus_per_run is not None and not 0 <= options.gpus_per_run <= 64:
        raise UsageError(f"--gpus_per_run={options.gpus_per_run} must be from 0 to 64 (a run is one node's torchrun)")
    if not 1 <= options.cpus_per_run <= 4096:
        raise UsageError(f"--cpus_per_run={options.cpus_per_run} must be from 1 to 4096")
    sbatch_options(options.sbatch)
    if options.launcher != "pool" and not options.collect:
        installed()
    if options.launcher == "slurm" and not dry_run and not options.collect and not shutil.which("sbatch"):
        raise UsageError("--launcher=slurm submits with sbatch, which is not on this machine's PATH: run sweep.py on "
                         "the cluster's login node, add --dry_run to see the jobs, or use --launcher=local")
    gpus = options.gpus_per_run if options.gpus_per_run is not None else int(scale == "gpu")
    return dataclasses.replace(options, gpus_per_run=gpus)


def installed():
    """submitit, or a UsageError saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise UsageError("--launcher needs submitit, which is not installed: pip install -r requirements.txt") from None
    return submitit


def sbatch_options(text):
    """{option: value} of --sbatch (True for an option without a value), for submitit's additional_parameters."""
    found = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not SBATCH_OPTION.fullmatch(item):
            raise UsageError(f"--sbatch: {item!r} is not an sbatch option; write name=value or name, comma-separated, "
                             "without dashes (constraint=h100,mem=64G,exclusive)")
        name, has_value, value = item.partition("=")
        found[name.replace("-", "_")] = value if has_value else True
    return found


def slurm_parameters(options, jobs, name):
    """submitit's SlurmExecutor parameters of a sweep's jobs: one task a job (train.py, or torchrun over its GPUs),
    the cluster's flags, stdout and stderr in one log, the stop signal SIGNAL_DELAY_S before the end, and at most
    `jobs` of the array running at once."""
    parameters = dict(job_name=name, time=options.time_min, nodes=1, ntasks_per_node=1,
                      cpus_per_task=options.cpus_per_run, array_parallelism=jobs, signal_delay_s=SIGNAL_DELAY_S,
                      stderr_to_stdout=True, setup=[pythonpath()], additional_parameters=sbatch_options(options.sbatch))
    if options.gpus_per_run:
        parameters["gpus_per_node"] = options.gpus_per_run
    for flag, key in (("partition", "partition"), ("account", "account"), ("qos", "qos")):
        if getattr(options, flag):
            parameters[key] = getattr(options, flag)
    return parameters


def pythonpath():
    """The job's first shell line: nanonorm's folder on the job's Python path, where submitit unpickles TrainJob
    (a job starts in the folder sbatch was called from, which need not be this one)."""
    return f"export PYTHONPATH={shlex.quote(HERE)}${{PYTHONPATH:+:$PYTHONPATH}}"


def submission_folder(out_dir):
    """Where submitit keeps a sweep's job files and logs (%j: the job's id)."""
    return os.path.join(os.path.abspath(out_dir), ".submitit", "%j")


def sbatch_script(options, jobs, name, out_dir, count):
    """The sbatch file submitit writes for an array of `count` runs, as text (--dry_run shows it): rendered by
    submitit's own writer, so it is what would be submitted."""
    from submitit.slurm import slurm  # its writer: the Slurm executor itself needs srun on this machine
    command = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {shlex.quote(submission_folder(out_dir))}"
    return slurm._make_sbatch_string(command=command, folder=submission_folder(out_dir), map_count=count,
                                     **slurm_parameters(options, jobs, name))


def executor(options, jobs, name, out_dir):
    """submitit's executor of the sweep's jobs: Slurm's, or the local one for --launcher=local."""
    submitit = installed()
    folder = submission_folder(out_dir)
    if options.launcher == "slurm":
        made = submitit.SlurmExecutor(folder, max_num_timeout=MAX_TIMEOUTS)
        made.update_parameters(**slurm_parameters(options, jobs, name))
    else:
        made = submitit.LocalExecutor(folder, max_num_timeout=MAX_TIMEOUTS)
        made.update_parameters(timeout_min=options.time_min, gpus_per_node=options.gpus_per_run,
                               signal_delay_s=SIGNAL_DELAY_S, setup=[pythonpath()], stderr_to_stdout=True)
    return made


@dataclass
class TrainJob:
    """One run's train.py as a job: submitit pickles it, and calls it on the node it runs on. argv: train.py's flags
    but --resume and --overwrite, which the job decides when it starts (a requeued job resumes)."""
    argv: list
    run_dir: str
    gpus: int

    def command(self):
        """train.py's command: one process, or torchrun's over the run's GPUs (one node)."""
        argv = [*self.argv, *restart_flags(self.run_dir)]
        if self.gpus > 1:
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.gpus}",
                    TRAIN, *argv]
        return [sys.executable, TRAIN, *argv]

    def __call__(self):
        """Run train.py into the run's folder, its output appended to <seed>.out; record its exit code in
        <seed>.exit and return it."""
        os.makedirs(os.path.dirname(self.run_dir), exist_ok=True)
        with open(self.run_dir + ".out", "a", opener=files.open_own) as out:
            out.write(f"--- {shlex.join(self.command())} (job {job_id()} on {socket.gethostname()})\n")
            out.flush()
            # train.py ignores USR2: Slurm may send it to every process of the job step, and it is submitit's
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=ignore_usr2)
            code = self.process.wait()
        files.write_atomic(self.run_dir + ".exit", f"{code}\n".encode())
        return code

    def checkpoint(self, *args, **kwargs):
        """submitit's call when the job is preempted or near its time limit: train.py is stopped with SIGTERM and
        waited for (it writes a checkpoint first), and the same run is handed back to be requeued."""
        process = getattr(self, "process", None)
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                os.waitpid(process.pid, 0)  # not process.wait(): this handler may interrupt that very call
            except ChildProcessError:
                pass  # it had ended, and was waited for already
        from submitit.helpers import DelayedSubmission
        return DelayedSubmission(TrainJob(self.argv, self.run_dir, self.gpus))


def ignore_usr2():
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def job_id():
    """The id of the job this process runs in: Slurm's (an array's task as ARRAY_TASK), or the local executor's."""
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID", os.environ.get("SUBMITIT_LOCAL_JOB_ID", "?"))


def record(run, job, launcher):
    """<seed>.job: which job runs the run, for a later invocation (queued)."""
    os.makedirs(os.path.dirname(run.dir), exist_ok=True)
    entry = {"launcher": launcher, "job_id": str(job.job_id), "folder": str(job.paths.folder),
             "host": socket.gethostname(), "submitted": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    files.write_atomic(run.dir + ".job", json.dumps(entry).encode())


def queued(run):
    """The job that still runs or waits to run the run ("Slurm job 123_4 (PENDING)"), or None: no job recorded
    (<seed>.job), or its job has ended. A local job is its controller process on the host that started it."""
    path = run.dir + ".job"
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        entry = files.read_json(path)
        launcher, job, folder, host = entry["launcher"], str(entry["job_id"]), entry["folder"], entry["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged record says nothing: the run counts by its folder, as any other
    if launcher == "local":
        alive = host == socket.gethostname() and job.isdigit() and signals.alive(int(job))
        return f"local job {job} (running)" if alive else None
    if launcher != "slurm" or not shutil.which("sacct"):
        return None  # Slurm cannot be asked from here
    import submitit
    state = submitit.SlurmJob(folder, job).state
    return f"Slurm job {job} ({state})" if state.split()[0] in ACTIVE else None


def run_all(runs, plan_flags, options, jobs, name, out_dir):
    """Every run as a job (plan_flags(run): its train.py flags but --resume and --overwrite), waited for: Slurm's as
    one array, the local ones `jobs` at a time. Prints each start and end as the pool does. None once all have ended,
    or the signal that stopped the waiting: Slurm's jobs go on (`--collect` later), local ones stop with a
    checkpoint."""
    made = executor(options, jobs, name, out_dir)
    waiting = [(run, TrainJob(plan_flags(run), run.dir, options.gpus_per_run)) for run in runs]
    running = []  # (run, its submitit job)
    handlers = signals.stop_on_signals()
    output = signals.keep_output(functools.partial(signals.hang_up, OUTPUT_LOST))
    try:
        if options.launcher == "slurm":
            running, waiting = submit(made, waiting, options.launcher), []
            print(f"submitted {len(running)} jobs as Slurm array {running[0][1].job_id.split('_')[0]}; a Ctrl-C "
                  "leaves them to Slurm, and the same command with --collect summarizes what has finished", flush=True)
        while waiting or running:
            while waiting and len(running) < jobs:
                running += submit(made, waiting[:1], options.launcher)
                waiting = waiting[1:]
            for run, job in [(run, job) for run, job in running if job.done()]:
                running.remove((run, job))
                print(f"exit {ended_with(run, job)} {run.dir}", flush=True)
            time.sleep(POLL_S[options.launcher])
    except BaseException as e:  # a signal, or a file sweep.py could not write: no local run is left running
        if options.launcher == "local":
            stop_local([job for _, job in running])
        if isinstance(e, KeyboardInterrupt):
            return signals.signum(e)
        raise
    finally:
        signals.restore_output(output)
        signals.restore(handlers)
    return None


def submit(made, pairs, launcher):
    """[(run, its submitit job)] of (run, TrainJob) pairs, each job recorded beside its run (record); several are one
    Slurm array."""
    with made.batch():
        submitted = [made.submit(job) for _, job in pairs]
    for (run, _), job in zip(pairs, submitted):
        record(run, job, launcher)
        print(f"start {run.dir} ({launcher} job {job.job_id})", flush=True)
    return [(run, job) for (run, _), job in zip(pairs, submitted)]


def ended_with(run, job):
    """The exit code the job recorded for its run, or why there is none (the job was killed, or failed to start)."""
    path = run.dir + ".exit"
    if os.path.isfile(path):
        return files.read_own(path).decode().strip()
    return f"none (job {job.job_id} ended {job.state.lower()} without one: see {run.dir}.out and {job.paths.stdout})"


def stop_local(jobs):
    """Stop the local jobs as the pool stops its runs: SIGINT to each job's controller, which passes it on; the runs
    write a checkpoint and stop."""
    for job in jobs:
        job.cancel()
    for job in jobs:
        while not job.done():
            time.sleep(0.1)

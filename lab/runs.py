"""
One run of a sweep's grid, as the sweep, its pool of processes and its summary see it: its folder, the exit code
sweep.py recorded beside it, its log's events and whether it has finished. Below lab/pool.py and lab/summary.py,
which both read it.
"""

import os
import re
import sys
from dataclasses import dataclass

from engine import files
from engine import run_reader
from engine.flags import UsageError

# the line of a sweep whose output's reader went away (`python sweep.py ... | head`, a closed terminal), while its
# runs run (lab/pool.py, lab/launch.py): it stops as for SIGHUP, and its stop line says what became of the runs
OUTPUT_LOST = "sweep.py: its output's reader went away (a closed pipe or terminal); the sweep stops as for SIGHUP"


@dataclass
class Run:
    """One (variant, LR, seed) of a sweep's grid and its run folder."""
    variant: str
    lr: str  # as written in --lrs: it names the folder
    seed: int
    dir: str


# the notes of the logs read so far, each once and in order, True once said: sweep.py says them once its checks have
# passed (say_notes), so that a refusal is one line, and a log read again is not noted again
NOTES = {}


def read_events(run_dir):
    """The events of a run's log.jsonl ([] if none) through run_reader.read_log: a last line cut short by a killed
    run is left out with a note (NOTES); any other damage is a UsageError naming the file and line."""
    events, note = run_reader.read_log(run_reader.log_path(run_dir))
    if note:
        NOTES.setdefault(note, False)
    return events


def forget_notes():
    """A new invocation's notes only (sweep.main, which the tests call many times in one process)."""
    NOTES.clear()


def say_notes():
    """The notes of the logs read so far that have not been said, on stderr, each once."""
    for note, said in NOTES.items():
        if not said:
            print(f"sweep.py: {note}", file=sys.stderr)
            NOTES[note] = True


def exit_code(run):
    """The exit code sweep.py recorded for the run's last attempt, or None: none recorded, or an empty file (sweep.py
    was killed while writing it). A negative one is the signal that killed the run (subprocess's -N: the OOM killer,
    kill -9), which leaves it unfinished. Anything else that is not a number is a UsageError naming the file."""
    path = run.dir + ".exit"
    problem = files.not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; sweep.py writes a run's exit code there")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        text = f.read().strip()
    if not text:
        return None
    if not re.fullmatch(rb"-?[0-9]{1,4}", text):
        shown = text[:20].decode("utf-8", "replace")
        raise UsageError(f"{path}: {shown!r} is not an exit code; sweep.py writes a number there (remove the file "
                         "to let the run's log decide)")
    return int(text)


def is_finished(run):
    """The run's end from its log and checkpoint (run_reader.end_state: a run started by --dry_run's commands has no
    .exit, and one stopped between its final checkpoint and its "done" line has finished), held to the exit code
    recorded beside it (run_reader.agreed_end: a 0 or 3 the log does not bear out is refused, not counted)."""
    return run_reader.agreed_end(run.dir, read_events(run.dir), exit_code(run), run.dir + ".exit") is not None


def restart_flags(run_dir):
    """How train.py starts in a run's folder: --resume beside a checkpoint, --overwrite where a previous attempt
    stopped before its first one, nothing in a fresh folder. Decided when the run starts (a job requeued after a
    preemption resumes)."""
    if run_reader.has_checkpoint(run_dir):
        return ["--resume"]
    if os.path.isdir(run_dir) and os.listdir(run_dir):
        return ["--overwrite"]  # a previous attempt stopped before its first checkpoint
    return []


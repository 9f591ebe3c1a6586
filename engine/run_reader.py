"""
A run folder (train.py --out_dir) as its readers see it, without torch: the names of its files, its config.json,
the events of its log.jsonl (one JSON object a line), whether the run ended, and its checkpoints. Nothing is
guessed: a file that is not what train.py writes is a UsageError naming it. engine/run_folder.py is the one
writer of these files. Imports only the standard library and engine's torch-free modules, so that plot.py reads
runs without loading torch.
"""

import json
import os

from engine.files import not_a_file
from engine.flags import UsageError

CONFIG = "config.json"  # the resolved configs and the data's description, written before the first step
LOG = "log.jsonl"  # one event a line
CHECKPOINT = "ckpt.pt"  # the newest checkpoint; ckpt-<step>.pt names the kept ones
ENDS = ("diverged", "done")  # the events that end a run


def parse_json(text):
    """json.loads, with a file nested deeper than Python's recursion limit ('[' * 100000) a ValueError like any other
    text that is not JSON nanonorm wrote (json.loads raises RecursionError on it). Every JSON reader of nanonorm's
    files reads through it."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to be JSON nanonorm wrote") from None


def config_path(run_dir):
    return os.path.join(run_dir, CONFIG)


def log_path(run_dir):
    return os.path.join(run_dir, LOG)


def checkpoint_path(run_dir, step=None):
    """ckpt.pt, or with a step ckpt-<step>.pt."""
    return os.path.join(run_dir, CHECKPOINT if step is None else f"ckpt-{step}.pt")


def is_run_file(name):
    """Whether a file name is one a run writes over: config.json, log.jsonl and the checkpoints."""
    return name in (CONFIG, LOG) or name.startswith("ckpt") and name.endswith(".pt")


def has_checkpoint(run_dir):
    """Whether the run left a checkpoint to resume from."""
    return os.path.exists(checkpoint_path(run_dir))


def numbered_checkpoints(run_dir):
    """{step: path} of the ckpt-<step>.pt files in run_dir."""
    found = {}
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        stem = name.removeprefix("ckpt-").removesuffix(".pt")
        if name.startswith("ckpt-") and name.endswith(".pt") and stem.isdigit():
            found[int(stem)] = os.path.join(run_dir, name)
    return found


def read_config(run_dir):
    """The run's config.json as {"model": ..., "train": ..., ...}; None where there is none. One that train.py did
    not write is a UsageError naming it."""
    path = config_path(run_dir)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, "rb") as f:
            config = parse_json(f.read())
    except (OSError, ValueError):
        config = None
    if not (isinstance(config, dict) and all(isinstance(config.get(k), dict) for k in ("model", "train"))):
        raise UsageError(f"{path} is not a config.json train.py wrote; remove the run (its folder, .exit and .out) "
                         "to run it again")
    return config


def ended(events):
    """Whether a run's events hold its end: a "done" or "diverged" event."""
    return any(e["event"] in ENDS for e in events)


# The fields every reader of a log relies on, by event name: each event has a step (an integer >= 0), and the
# losses that resume, sweep.py and plot.py read are numbers (NaN and infinity included: a diverged run logs them).
EVENT_NUMBERS = {"train": ("loss",), "eval": ("val_loss",), "done": ("val_loss",)}
JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
              list: "a list", dict: "an object"}


def damaged_field(event):
    """What is wrong with an event's step or losses ("step is null, not an integer"), or None."""
    step = event.get("step")
    if "step" not in event:
        return "step is missing"
    if type(step) is not int:
        return f"step is {JSON_NAMES[type(step)]}, not an integer"
    if step < 0:
        return f"step is {step}, not an integer >= 0"
    for name in EVENT_NUMBERS.get(event["event"], ()):
        if name not in event:
            return f"{name} is missing"
        if type(event[name]) not in (int, float):
            return f"{name} is {JSON_NAMES[type(event[name])]}, not a number"
    return None


def read_log(path):
    """(events, note) of a log.jsonl: one JSON object with an "event" per line. A last line without its newline
    was cut short by a killed run: it is left out, and note says so ("" otherwise). No file is no events.
    Anything else (a line that is not such an object, an event whose step or losses are missing or not numbers
    (damaged_field), text that is not UTF-8, a folder or a broken symlink in the log's place) is a UsageError
    naming the file and the line: nothing is guessed, and the caller writes nothing."""
    problem = not_a_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; a run's log.jsonl is a file of JSON lines")
    if not os.path.exists(path):
        return [], ""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    torn = lines.pop()  # what follows the last newline: nothing, in a whole log
    events = []
    for number, line in enumerate(lines, 1):
        try:
            event = parse_json(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"{path}:{number}: not UTF-8 text; it is not a log nanonorm wrote") from None
        except ValueError:
            raise UsageError(f"{path}:{number}: not JSON; it is not a log nanonorm wrote") from None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise UsageError(f'{path}:{number}: not an event (a JSON object with an "event" name); it is not a log '
                             "nanonorm wrote")
        events.append(event)
    for number, event in enumerate(events, 1):  # once every line is an event: a foreign line is named first
        damage = damaged_field(event)
        if damage:
            raise UsageError(f"{path}:{number}: {event['event']} event: {damage}; it is not a log nanonorm wrote")
    note = f"{path}:{len(lines) + 1}: the last line was cut short (a killed run); left out" if torn else ""
    return events, note

"""
A run folder (train.py --out_dir) as its readers see it, without torch: the names of its files, its config.json,
the events of its log.jsonl (one JSON object a line), whether the run ended, and its checkpoints. Nothing is
guessed: a file that is not what train.py writes is a UsageError naming it. engine/run_folder.py is the one
writer of these files. Imports only the standard library and engine's torch-free modules, so that plot.py reads
runs without loading torch.
"""

import json
import os

from engine.files import not_own_file, parse_json, read_json, read_own
from engine.flags import UsageError

CONFIG = "config.json"  # the resolved configs and the data's description, written before the first step
LOG = "log.jsonl"  # one event a line
CHECKPOINT = "ckpt.pt"  # the newest checkpoint; ckpt-<step>.pt names the kept ones
ENDS = ("diverged", "done")  # the events that end a run
# What sweep.py writes beside its runs' folders, at the top of its --out_dir: its locks (sweep.py's RUNNING, held for
# the sweep's life; lab/summary.py's SWEEP_LOCK), its summaries and the record of its recipe's design. A folder
# holding one is a sweep's, never a run's (run_folder.refuse_a_sweep).
SWEEP_FILES = ("sweep.running.lock", "sweep.lock", "summary.json", "summary.csv", "design.json")


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
    """Whether the run left a checkpoint to resume from: ckpt.pt, or a ckpt-<step>.pt, from which train.py --resume
    goes on where ckpt.pt is gone (run_folder.newest_checkpoint)."""
    return os.path.exists(checkpoint_path(run_dir)) or bool(numbered_checkpoints(run_dir))


def numbered_checkpoints(run_dir):
    """{step: path} of the ckpt-<step>.pt files in run_dir."""
    found = {}
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        stem = name.removeprefix("ckpt-").removesuffix(".pt")
        # ASCII digits: str.isdigit() takes "²" too, which int() refuses
        if name.startswith("ckpt-") and name.endswith(".pt") and stem.isascii() and stem.isdigit():
            found[int(stem)] = os.path.join(run_dir, name)
    return found


RUN_AGAIN = "remove the run (its folder, .exit and .out) to run it again"  # a sweep's run, which sweep.py reruns


def read_config(run_dir, advice=RUN_AGAIN):
    """The run's config.json as {"model": ..., "train": ..., ...}; None where there is none. One that train.py did
    not write is a UsageError naming it, then advice (what the reader's user can do: a resume writes it anew)."""
    path = config_path(run_dir)
    if not os.path.lexists(path):
        return None
    try:
        config = read_json(path)  # a regular file only: never through a link, never a FIFO
    except (OSError, ValueError):
        config = None
    if not (isinstance(config, dict) and all(isinstance(config.get(k), dict) for k in ("model", "train"))):
        raise UsageError(f"{path} is not a config.json train.py wrote; {advice}")
    return config


def end_state(run_dir, events):
    """"done" or "diverged" where the run has ended, else None: the end event of its log (events); or, without one,
    "done" where its log holds the final evaluation (step max_iters of its config.json) and its newest checkpoint is
    at that step. train.py logs the final evaluation, writes its checkpoint, then logs "done": a run stopped between
    the last two has trained and evaluated every step, and a resume of it is refused as already past max_iters. The
    newest checkpoint's step is read from its ckpt-<step>.pt name (--keep_checkpoints >= 1 keeps it), not from
    the checkpoint, which only torch reads."""
    end = next((e["event"] for e in events if e["event"] in ENDS), None)
    if end:
        return end
    config = read_config(run_dir)
    last = config["train"].get("max_iters") if config else None
    evaluated = any(e["event"] == "eval" and e["step"] == last for e in events)
    return "done" if evaluated and max(numbered_checkpoints(run_dir), default=None) == last else None


EXIT_ENDS = {0: "done", 3: "diverged"}  # train.py's exit code after each end event, and only after it


def agreed_end(run_dir, events, code, exit_path):
    """end_state, held to the exit code recorded for the run in exit_path (code; None where none is): train.py exits
    with 0 only once its "done" line is written and with 3 only once its "diverged" line is, so a 0 or 3 beside a
    log that says otherwise (an .exit edited, a log removed or another run's, a run folder deleted) is a UsageError
    of one line naming both, not a result. Another code (a signal's, a refusal's) says nothing about the log."""
    end = end_state(run_dir, events)
    said = EXIT_ENDS.get(code)
    if said and end != said:
        if not os.path.isdir(run_dir):
            found = f"the run's folder {run_dir} is gone"
        elif not os.path.lexists(log_path(run_dir)):
            found = f"{log_path(run_dir)} is gone"
        else:
            found = f"{log_path(run_dir)} " + (f"ends in {end}" if end else "has no end")
        raise UsageError(f"{exit_path} records exit code {code} ({said}), but {found}; they are not one run's: "
                         f"remove {exit_path} to let the log decide, or remove the run (its folder, .exit and .out) "
                         "to run it again")
    return end


NUMBER = (int, float)
# where an op is: a block's index, or null outside the blocks (the embeddings, the logits)
LAYER = (int, type(None))
# The fields every reader of a log relies on, by event name, as shapes (mismatch): each event has a step (an
# integer >= 0), and the fields that resume, sweep.py's summary and plot.py read are there with their types (a loss
# may be NaN or infinite: a diverged run logs them).
EVENT_FIELDS = {
    "train": {"loss": NUMBER, "lr": NUMBER},
    "eval": {"val_loss": NUMBER},
    "done": {"val_loss": NUMBER},
    "diverged": {"steps_survived": int, "lr": NUMBER, "reason": str},
    "telemetry": {"weights": [{"layer": LAYER, "op": None, "name": str, "grad_l2": NUMBER, "grad_mean_abs": NUMBER}],
                  "attn_logit_max": [{"value": NUMBER}], "logits": {"mean_log_z": NUMBER}},
}
# The fields an event may leave out or set to null, with the shape they have where given.
OPTIONAL_FIELDS = {
    "eval": {"lr": NUMBER, "val_loss_batch_stats": NUMBER},
    "diverged": {"criterion": str, "failed_op": {"op": str, "layer": LAYER},
                 "grew_most": {"op": str, "layer": LAYER, "ratio": NUMBER}},
}
JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null",
              list: "a list", dict: "an object"}


def kind_of(value):
    """JSON's name of value's type ("a string"); a checkpoint's values (run_folder) may be any type: "a Tensor"."""
    return JSON_NAMES.get(type(value), f"a {type(value).__name__}")


def mismatch(value, shape, where):
    """Where a JSON value is not of the shape, such as "runs[2].lr is missing"; None where it is. A shape: a dict
    is a JSON object with at least these keys, [x] a list whose items are each x, [x, y, z] a list of exactly these
    items (a row), a type (or a tuple of types) the value's type (exactly: true is not a number), a set the values
    allowed, None any value."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is {kind_of(value)}, not an object"
        for key, inner in shape.items():
            name = f"{where}.{key}" if where else key
            found = f"{name} is missing" if key not in value else mismatch(value[key], inner, name)
            if found:
                return found
    elif isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {kind_of(value)}, not a list"
        if len(shape) > 1 and len(value) != len(shape):  # a row: the readers unpack it
            return f"{where} has {len(value)} items, not {len(shape)}"
        for i, item in enumerate(value):
            found = mismatch(item, shape[i] if len(shape) > 1 else shape[0], f"{where}[{i}]")
            if found:
                return found
    elif isinstance(shape, set):
        if value not in shape:
            return f"{where} is {json.dumps(value)[:40]}, not one of {', '.join(sorted(shape))}"
    elif shape is not None and type(value) not in (shape if isinstance(shape, tuple) else (shape,)):
        kinds = shape if isinstance(shape, tuple) else (shape,)
        expected = " or ".join(JSON_NAMES[kind] for kind in kinds if not (kind is int and float in kinds))
        return f"{where} is {kind_of(value)}, not {expected}"
    return None


def damaged_field(event):
    """What is wrong with an event's step or the fields its readers rely on ("step is null, not an integer",
    "diverged event: steps_survived is missing"), or None."""
    step = event.get("step")
    if "step" not in event:
        return "step is missing"
    if type(step) is not int:
        return f"step is {JSON_NAMES[type(step)]}, not an integer"
    if step < 0:
        return f"step is {step}, not an integer >= 0"
    found = mismatch(event, EVENT_FIELDS.get(event["event"]), "")
    if found:
        return found
    given = {k: v for k, v in event.items() if v is not None}
    optional = {k: v for k, v in OPTIONAL_FIELDS.get(event["event"], {}).items() if k in given}
    return mismatch(given, optional, "")


def read_log(path):
    """(events, note) of a log.jsonl: one JSON object with an "event" per line. A last line without its newline
    was cut short by a killed run: it is left out, and note says so ("" otherwise). No file is no events.
    Anything else (a line that is not such an object, an event whose step or losses are missing or not numbers
    (damaged_field), text that is not UTF-8, a folder or a broken symlink in the log's place) is a UsageError
    naming the file and the line: nothing is guessed, and the caller writes nothing."""
    problem = not_own_file(path)
    if problem:
        raise UsageError(f"{path} is {problem}; a run's log.jsonl is a file of JSON lines")
    if not os.path.exists(path):
        return [], ""
    lines = read_own(path).split(b"\n")
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
    for number, (before, event) in enumerate(zip(events, events[1:]), 2):
        # train.py logs in step order, and a resume cuts the log back to its step: a step that goes back is two logs
        # pasted together, or an edited one
        if event["step"] < before["step"]:
            raise UsageError(f"{path}:{number}: step {event['step']} after step {before['step']}; a run's log goes "
                             "forward in steps, so this is not one run's log")
    note = f"{path}:{len(lines) + 1}: the last line was cut short (a killed run); left out" if torn else ""
    return events, note

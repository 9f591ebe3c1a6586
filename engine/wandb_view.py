"""
--wandb: a run's events in a Weights & Biases run, as nanoGPT's train.py sends them (its wandb_log, wandb_project,
wandb_run_name): one of the run's views (engine/views.py), like --tensorboard's event files, and never read back.
Each event is one wandb.log of its numbers under the tags every view uses (train/loss, eval/val_loss,
telemetry.acts.std/fc2/layer_3, ...) with its step under "step", the x axis of every chart (nanoGPT logs its iter
the same way); every event but the routine ones also goes whole into the run's summary under its name (spike,
diverged, done: the end of the run). The W&B config is the run's config.json (the resolved configs, the data, the
machine), and the key:value tags under "tags" too, so that W&B's Group by can pick one (tags.variant). The tags are
lr:<lr>, seed:<seed>, preset:<preset> where a preset is given, and those --wandb_tags adds (sweep.py: recipe:<name>,
variant:<variant>); the group is --wandb_group (sweep.py: the recipe).

W&B runs online where it holds an API key (WANDB_API_KEY, or `wandb login`), else offline, into
<WANDB_DIR, or the run folder>/wandb/offline-run-<time>-<id>/, and one note says where and how to upload it
(`wandb sync`); an online start that fails (W&B does not answer within INIT_TIMEOUT seconds, or refuses the key)
goes offline the same way. WANDB_MODE, where set, decides instead (W&B's own variable). A W&B that fails (cannot
start, log or finish) is one note and the view ends there: the run goes on, and log.jsonl holds every event. wandb
is imported only here, only with --wandb.

A resumed run continues its W&B run: the W&B run's id is kept in the run folder (wandb.json), and a resume opens
that run again (resume="allow") and logs from its checkpoint's step on (the steps between the checkpoint and the
stop are logged again, with the same losses: the resume is exact). A fresh run forgets the id of the run it
replaces, and a new W&B run of a run that has events already (a resume that adds --wandb; plot.py --wandb) logs
them first. Only process 0 calls start, so only process 0 sends anything.
"""

import errno
import importlib.util
import json
import os
import shlex
import sys

from engine import files
from engine import run_reader
from engine import views
from engine.flags import UsageError

PROJECT = "nanonorm"  # --wandb_project's default (configs.py)
STATE = "wandb.json"  # in the run folder: {"id": the W&B run's id}, which a resume continues
STEP = "step"  # the key of each event's step, the x axis of the run's charts
INIT_TIMEOUT = 30  # seconds an online start waits for W&B (wandb.init's own default: 90); WANDB_INIT_TIMEOUT wins
TAG_LENGTH = 64  # W&B refuses a longer tag


def check_installed(enabled):
    """--wandb needs the wandb package; without it, one line before anything is written (UsageError). Found, not
    imported: importing wandb takes a second."""
    if enabled and importlib.util.find_spec("wandb") is None:
        raise UsageError("--wandb needs the wandb package, which is not installed; pip install wandb, or run without "
                         "--wandb")


def start(out_dir, log_path, enabled, resumed, script="train.py"):
    """The run's W&B view at the start of a run, on process 0: a fresh run (not resumed) forgets the W&B run of
    the one it replaces; with enabled, the run's W&B run (open_run) shows each event logged to log_path from here
    on, and first those log.jsonl holds where that W&B run is new. script: the command whose notes they are
    (plot.py --wandb writes a finished run's W&B run this way)."""
    state = os.path.join(out_dir, STATE)
    if not resumed:
        forget(state, script)
    if not enabled:
        return
    try:
        run, continued = open_run(out_dir, state, script)
    except Exception as e:  # wandb fails in errors of many kinds (its own, OSError, TimeoutError): none ends the run
        note(script, f"cannot start the W&B run ({reason(e)}); the view ends before it began, log.jsonl holds "
                     "every event")
        return
    view = View(run, script)
    events = run_reader.read_log(log_path)[0]
    # a continued W&B run holds the events up to the checkpoint already; new is the resume's own event, the log's
    # last line where the resume changed a setting (run_folder.write_run_files)
    for event in [e for e in events[-1:] if e["event"] == "resumed"] if continued else events:
        view.show(event)
    views.add(log_path, view)


def forget(state, script):
    """wandb.json removed: the run in the folder is no longer the one whose W&B run it names."""
    try:
        os.remove(state)
    except FileNotFoundError:
        pass
    except OSError as e:
        note(script, f"cannot remove {state} ({e.strerror}); a resume of this run would continue the W&B run of the "
                     "run it replaced: remove the file")


def open_run(out_dir, state, script):
    """(the W&B run of the run in out_dir, whether it continues the W&B run wandb.json names), started with the
    names, tags and config of its config.json, its id written to wandb.json, and its one note said."""
    import wandb  # here: nanonorm without --wandb never imports it
    config = run_reader.read_config(out_dir) or {}
    train = config.get("train", {})
    folder = os.environ.get("WANDB_DIR") or out_dir
    os.makedirs(folder, exist_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):  # wandb would write its run into the system's temporary folder
        raise OSError(errno.EACCES, f"{folder} is not writable")
    previous = previous_id(state, script)
    tags = run_tags(train)
    timeout = {} if "WANDB_INIT_TIMEOUT" in os.environ else {"init_timeout": INIT_TIMEOUT}
    settings = wandb.Settings(silent=True, console="off", **timeout)  # the notes below say what there is to say
    wandb.setup(wandb.Settings(silent=True))  # before login, which would otherwise print who is logged in
    # W&B's own mode where WANDB_MODE says one; else online with a key (login asks no one and no server here)
    mode = None if os.environ.get("WANDB_MODE") else "online" if wandb.login(prompt=False, verify=False) else "offline"
    why = f"WANDB_MODE={os.environ.get('WANDB_MODE')}" if mode is None else "no W&B API key here (WANDB_API_KEY, " \
        "or `wandb login`)"
    names = dict(project=train.get("wandb_project") or PROJECT, group=train.get("wandb_group"),
                 name=train.get("wandb_run_name") or os.path.basename(os.path.abspath(out_dir)),
                 tags=[tag[:TAG_LENGTH] for tag in tags], config={**config, "tags": keyed(tags)}, dir=folder,
                 id=previous, resume="allow" if previous else None, settings=settings)
    try:
        run = wandb.init(mode=mode, reinit="create_new", **names)
    except Exception as e:  # online, and W&B did not answer or refused the key
        if mode != "online":
            raise
        why = f"W&B online failed ({reason(e)})"
        run = wandb.init(mode="offline", reinit="create_new", **names)
    try:
        files.write_atomic(state, json.dumps({"id": run.id}).encode())
    except Exception:
        run.finish()
        raise
    run.define_metric(STEP, hidden=True)
    run.define_metric("*", step_metric=STEP)
    if run.offline:
        note(script, f"{why}, so the W&B run is offline, in {run.sync_dir}; upload it with: wandb sync "
                     f"{shlex.quote(run.sync_dir)}")
    elif run.url:
        note(script, f"the W&B run is {run.url}")
    else:  # WANDB_MODE=disabled
        note(script, f"{why}, so W&B keeps nothing of this run")
    return run, previous is not None


def previous_id(state, script):
    """The W&B run id wandb.json holds, or None where there is none (a damaged one is said, and a new W&B run
    starts)."""
    try:
        saved = files.read_json(state)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        note(script, f"{state} is not the W&B run's id nanonorm wrote ({reason(e)}); a new W&B run starts")
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("id"), str) or not saved["id"]:
        note(script, f"{state} holds no W&B run id; a new W&B run starts")
        return None
    return saved["id"]


def run_tags(train):
    """The run's W&B tags: lr:<lr>, seed:<seed>, preset:<preset> where one is given, then --wandb_tags's."""
    own = [f"{name}:{train[name]}" for name in ("lr", "seed", "preset") if train.get(name) is not None]
    return own + [tag for tag in (train.get("wandb_tags") or "").split(",") if tag]


def keyed(tags):
    """{key: value} of the key:value tags."""
    return dict(tag.split(":", 1) for tag in tags if ":" in tag)


class View:
    """A run's W&B run: each event logged at its step (show). A W&B that fails ends the view with one note, not
    the run: log.jsonl holds every event."""

    def __init__(self, run, script="train.py"):
        self.run, self.script = run, script

    def show(self, event):
        if self.run is None:
            return
        try:
            self.write(event)
        except Exception as e:  # as in start: no failure of W&B ends the run
            self.stop(e, f"at step {event['step']}")

    def write(self, event):
        numbers = dict(views.scalars(event))
        if numbers:
            self.run.log({STEP: event["step"], **numbers})
        if event["event"] not in views.ROUTINE:
            self.run.summary[event["event"]] = event

    def close(self):
        """The W&B run finished and its files whole: wandb.teardown ends W&B's service process, which writes the
        run's last records after finish has returned (a reader in this process found them missing)."""
        if self.run is None:
            return
        import wandb
        try:
            self.run.finish()
            wandb.teardown()
        except (Exception, SystemExit) as e:  # teardown calls sys.exit where the service ended badly: W&B's failure
            self.stop(e, "at the end")
        self.run = None

    def stop(self, error, where):
        note(self.script, f"W&B failed ({reason(error)}); the view ends {where}, log.jsonl holds every event")
        self.run = None


def note(script, text):
    print(f"{script}: note: --wandb: {text}", file=sys.stderr)


def reason(error):
    """An error's first line, or its kind where it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

"""
--tensorboard: a run's events as TensorBoard event files in its run folder, to watch runs as they train
(`tensorboard --logdir=<run folder or sweep folder>`): one of the run's views (engine/views.py), which says what is
shown under which tag. Each event's numbers are scalars at its step, the per-layer ones with a custom-scalars chart
per figure (the tag less its layer) that draws every layer on one chart; every event but the routine ones is text
too, under its name, its log line whole.

Every start rebuilds the view from log.jsonl, which the start has just written (run_folder.start_run): the folder's
nanonorm event files (named *.nanonorm; no other file is touched) are removed, and with --tensorboard a new one is
written with the events log.jsonl holds, a resumed run's up to its checkpoint. A resumed run thus has each step once
in the files; a TensorBoard that was watching it shows the new file's points in place of the old ones (its default
loader; purge_step=0 tells the older one too, which stops at a removed file, though, until it is restarted). Only
process 0 calls start, so only process 0 writes. plot.py --tensorboard rebuilds a finished run's view whole or not at
all (rebuild): its view is the command's one product, so a write that fails is exit code 1, not a note.
"""

import contextlib
import glob
import json
import os
import re
import sys
import threading

from engine import files
from engine import run_reader
from engine import views
from engine.flags import UsageError

SUFFIX = ".nanonorm"  # the end of the event files a run writes: the files it may remove
TMP_SUFFIX = SUFFIX + ".tmp"  # the end of a view being rebuilt (rebuild), renamed to SUFFIX once whole
FLUSH_SECS = 5  # TensorBoard looks for new data every 5 s: a curve lags the run by about 10 s


def check_installed(enabled):
    """--tensorboard needs the tensorboard package; without it, one line before anything is written (UsageError)."""
    if not enabled:
        return
    try:
        import torch.utils.tensorboard  # noqa: F401 (only here and in View: nanonorm runs without tensorboard)
    except ImportError:
        raise UsageError("--tensorboard needs the tensorboard package, which is not installed; pip install "
                         "tensorboard, or run with --tensorboard=False") from None


def start(out_dir, log_path, enabled):
    """The run's view at the start of a run, on process 0: the folder's nanonorm event files removed, and with
    enabled a new one that shows the events log.jsonl holds now and, from here on, each event logged to log_path."""
    try:
        remove_views(out_dir)
        remove_views(out_dir, TMP_SUFFIX)
        if not enabled:
            return
        view = View(out_dir)
    except OSError as e:
        if enabled:
            stopped(out_dir, e, "before it began")
        return
    for event in run_reader.read_log(log_path)[0]:
        view.show(event)
    views.add(log_path, view)


def event_files(out_dir, suffix=SUFFIX):
    """The event files in out_dir whose names end in suffix: a view's (SUFFIX) or a rebuild's (TMP_SUFFIX)."""
    return glob.glob(os.path.join(glob.escape(out_dir), "events.out.tfevents.*" + suffix))


def remove_views(out_dir, suffix=SUFFIX):
    """Every event file of out_dir whose name ends in suffix removed; the first OSError is raised once all the others
    are gone (each one left would show its steps beside the new ones)."""
    failed = None
    for path in event_files(out_dir, suffix):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            failed = failed or e
    if failed:
        raise failed


def rebuild(out_dir, log_path):
    """plot.py --tensorboard: out_dir's view rebuilt from log_path, whole or not at all. The events go to a temporary
    event file (*.nanonorm.tmp, which a rebuild killed on the way leaves and the next start or rebuild removes),
    flushed to the disk and renamed in place of the folder's old view only once every event is written. A write that
    fails (a full disk, `ulimit -f`: TensorBoard's writer thread meets it) is a WriteError naming the file, with the
    old view as it was and the temporary file removed."""
    try:
        remove_views(out_dir, TMP_SUFFIX)
        view = View(out_dir, suffix=TMP_SUFFIX)
        try:
            for event in run_reader.read_log(log_path)[0]:
                view.write(event)
            view.writer.flush()  # raises what the writer thread met (EventFileWriter._check_worker_status)
        finally:
            view.writer.close()
        [tmp] = event_files(out_dir, TMP_SUFFIX)
        with open(tmp, "rb", opener=files.open_own) as f:
            os.fsync(f.fileno())
        remove_views(out_dir)
        os.replace(tmp, tmp.removesuffix(".tmp"))
    except BaseException as e:
        made = event_files(out_dir, TMP_SUFFIX)
        with contextlib.suppress(OSError):
            remove_views(out_dir, TMP_SUFFIX)
        if isinstance(e, OSError) and not isinstance(e, files.NotAFile):
            new = made[0].removesuffix(".tmp") if made else os.path.join(out_dir, "events.out.tfevents.*" + SUFFIX)
            raise files.cannot_write(e.filename or new, e) from None
        raise


class View:
    """A run's event files, written by torch's SummaryWriter: each event at its step (show). A write that fails
    (a full disk) ends the view with one note, not the run: log.jsonl holds every event."""

    def __init__(self, out_dir, suffix=SUFFIX):
        from torch.utils.tensorboard import SummaryWriter  # here: nanonorm without --tensorboard never needs it
        self.out_dir = out_dir
        threading.excepthook = quiet_writer_thread
        self.writer = SummaryWriter(out_dir, purge_step=0, flush_secs=FLUSH_SECS, filename_suffix=suffix)
        self.figures = set()  # the per-layer figures charted so far (custom scalars)

    def show(self, event):
        if self.writer is None:
            return
        try:
            self.write(event)
        except OSError as e:
            self.stop(e, f"at step {event['step']}")

    def write(self, event):
        step = event["step"]
        figures = set()
        for tag, value in views.scalars(event):
            self.writer.add_scalar(tag, value, step)
            if re.search(r"/layer_\d+$", tag):
                figures.add(tag.rsplit("/", 1)[0])
        if event["event"] not in views.ROUTINE:
            self.writer.add_text(event["event"], "    " + json.dumps(event), step)  # indented: Markdown's code
        if not figures <= self.figures:
            self.figures |= figures
            self.writer.add_custom_scalars(layout(self.figures))

    def close(self):
        if self.writer is None:
            return
        try:
            self.writer.flush()  # raises what the writer thread met since the last event; close alone drops it
            self.writer.close()
        except OSError as e:
            with contextlib.suppress(OSError):
                self.writer.close()
            self.stop(e, "at the end")
        self.writer = None

    def stop(self, error, where):
        stopped(self.out_dir, error, where)
        self.writer = None


def quiet_writer_thread(args):
    """threading.excepthook: the OSError that ends TensorBoard's writer thread (a full disk) is not printed as a
    traceback, since the thread keeps it and the View's next write or flush raises it (EventFileWriter.
    _check_worker_status), which says it once; any other thread's error goes to Python's own hook."""
    if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError):
        return
    threading.__excepthook__(args)


def stopped(out_dir, error, where):
    """train.py's one note of a view whose event files cannot be written or removed (a full disk, a folder in the
    way)."""
    print(f"train.py: note: --tensorboard: cannot write the event files in {out_dir} ({error.strerror or error}); "
          f"the view ends {where}, log.jsonl holds every event", file=sys.stderr)


def layout(figures):
    """The custom-scalars layout: per section (a tag's part before its first /), one chart per figure with every
    layer's tag on it."""
    sections = {}
    for figure in sorted(figures):
        sections.setdefault(figure.split("/")[0], {})[figure] = ["Multiline", [rf"^{re.escape(figure)}/layer_\d+$"]]
    return sections

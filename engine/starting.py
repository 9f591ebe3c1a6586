"""
Imported first by the scripts that import a large library (train.py, sweep.py, sample.py: torch; data.py: numpy and
tiktoken; plot.py: the lab's modules, then matplotlib), for its one effect: a Ctrl-C in the seconds those take to
import, before the script's own handling of Ctrl-C begins, stops it at once with one line and exit code 130,
`train.py: stopped by Ctrl-C while starting; nothing was written`, not a KeyboardInterrupt traceback and -2. Nothing
is written before then, so there is nothing to clean up. The script says where its own handling begins by calling
`done()` (train.py: inside the `try` that catches KeyboardInterrupt, so that no Ctrl-C falls between the two); from
there on a Ctrl-C is Python's KeyboardInterrupt again. Only where the script itself was started (its file is
__main__'s): a test or a notebook that imports train keeps Python's own Ctrl-C. Not covered: the interpreter's own
start, before the script's first line runs (about 70 ms, more under load), where Python's own rules apply. Its second
effect: a closed pipe (`python sweep.py --dry_run | head`) ends the script quietly, as it ends `cat`, instead of a
BrokenPipeError traceback (train.py's run replaces that with signals.keep_output). Imports only the standard library.
"""

import contextlib
import os
import signal
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root, where the scripts are


def stop(signum, frame):
    """One line and exit code 130 at once. os._exit, not an exception: the handler runs wherever the import is, and an
    exception raised there can land inside a C extension's initialization (numpy's, torch's pybind11 modules), which
    then aborts the process, swallows it and trains on, or leaves the module half-loaded ("cannot load module more
    than once per process"). os.write, not print: the handler may interrupt a print to stderr."""
    script = os.path.basename(sys.modules["__main__"].__file__)
    with contextlib.suppress(OSError):  # no stderr to say it on: the exit code still says it
        os.write(2, f"{script}: stopped by Ctrl-C while starting; nothing was written\n".encode())
    os._exit(130)


def done():
    """The script handles Ctrl-C from here on: Python's KeyboardInterrupt again. A no-op where this module installed
    nothing (a test or a notebook that imports the script), so that their own handler stays."""
    if signal.getsignal(signal.SIGINT) is stop:
        signal.signal(signal.SIGINT, signal.default_int_handler)


main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
if os.path.dirname(os.path.abspath(main_file)) == HERE:
    signal.signal(signal.SIGINT, stop)
    if hasattr(signal, "SIGPIPE"):  # POSIX: the reader went away, so nothing printed from here on can be read
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

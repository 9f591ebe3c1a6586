"""
Stops by signal and their exit codes: SIGTERM and SIGHUP (a kill, a closed terminal or ssh session) made to unwind
as a Ctrl-C does, so that every `finally` runs and no temporary file is left, and the exit code a shell gives a
process that a signal ended, 128 + its number (130 for Ctrl-C), so that a script reads a stop the same whichever
way it came. A run's output whose reader goes away (a closed pipe or terminal: Output) stops it as SIGHUP does,
instead of SIGPIPE ending it with nothing saved. Also whether a process is alive, which signal 0 asks without sending
anything.
"""

import contextlib
import errno
import os
import signal
import sys

# the signals a person or a machine sends to stop a process that may clean up; SIGINT is Python's KeyboardInterrupt
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: a KeyboardInterrupt, so that it unwinds as a Ctrl-C does, which knows its signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum, frame):
    raise Stopped(signum)


def stop_on_signals():
    """SIGTERM and SIGHUP raise Stopped from here on, as SIGINT raises KeyboardInterrupt; returns the handlers they
    had, for restore."""
    return {sig: signal.signal(sig, raise_stopped) for sig in STOP_SIGNALS}


def restore(handlers):
    """Put back the handlers that stop_on_signals (or signal.signal) returned."""
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


class Output:
    """sys.stdout or sys.stderr of a run, whose reader may go away: a pipe's (`python train.py | head -3`) or a closed
    terminal's. The first write or flush that finds the reader gone (EPIPE, with SIGPIPE ignored; EIO, from a terminal
    that hung up) points the stream at /dev/null, so that nothing raises in the middle of a step or fails at exit, and
    calls lost(); what is written from then on is dropped. Line-buffered, so that each line is written as printed
    and a reader that goes away is noticed at the next line, not 8 KB of lines later."""

    def __init__(self, stream, lost):
        self.stream, self.lost, self.gone = stream, lost, False
        # the stream's own, for restore_output; a stream without reconfigure (io.StringIO) is left as it is
        self.line_buffering = getattr(stream, "line_buffering", None) if hasattr(stream, "reconfigure") else None
        if self.line_buffering is False:
            self.attempt(stream.reconfigure, line_buffering=True)

    def write(self, text):
        self.attempt(self.stream.write, text)
        return len(text)

    def flush(self):
        self.attempt(self.stream.flush)

    def attempt(self, operation, *args, **kwargs):
        try:
            operation(*args, **kwargs)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.EIO) or self.gone:
                raise
            self.gone = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())  # what the stream still holds is written there
            os.close(devnull)
            self.lost()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def keep_output(lost):
    """sys.stdout and sys.stderr as Outputs that call lost() when a reader goes away, with SIGPIPE ignored (Python's
    own default, which engine/starting.py replaces); returns what restore_output puts back."""
    kept = signal.signal(signal.SIGPIPE, signal.SIG_IGN), sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Output(sys.stdout, lost), Output(sys.stderr, lost)
    return kept


def hang_up(line):
    """keep_output's lost() for a script that stops on SIGHUP (stop_on_signals): line said on stderr, where it may
    still be read, then SIGHUP sent to the script itself, so that an output whose reader went away stops it by the
    path a closed terminal takes (sweep.py: its runs stop with a checkpoint)."""
    print(line, file=sys.stderr)
    os.kill(os.getpid(), signal.SIGHUP)


def restore_output(kept):
    """Put back what keep_output replaced (kept None: nothing), once the Outputs are flushed."""
    if kept is None:
        return
    for output in (sys.stdout, sys.stderr):
        if isinstance(output, Output):
            output.lost = lambda: None  # the run has ended: a reader gone by now loses nothing
            output.flush()
            if output.line_buffering is False:
                output.attempt(output.stream.reconfigure, line_buffering=False)
    handler, sys.stdout, sys.stderr = kept
    signal.signal(signal.SIGPIPE, handler)


def signum(stop):
    """The signal a KeyboardInterrupt or Stopped stands for: SIGINT for a Ctrl-C."""
    return getattr(stop, "signum", signal.SIGINT)


def exit_code(sig):
    """128 + the signal's number, as a shell reports a process the signal ended (130 for Ctrl-C)."""
    return 128 + sig


def name(sig):
    """How a stop is named to a person: Ctrl-C, SIGTERM, SIGHUP."""
    return "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name


def exit_at_once(stop, when, say=True):
    """End this process now, for a stop (a KeyboardInterrupt or Stopped) that came where a thread cannot be stopped
    (a C++ wait): one line (where say), `train.py: stopped by SIGTERM <when>`, and 128 + the signal. os._exit: an
    interpreter that exits around a thread still in C++ can abort in its teardown."""
    sig = signum(stop)
    with contextlib.suppress(OSError):  # an output already gone: the exit code still says it
        sys.stdout.flush()
        if say:
            print(f"{os.path.basename(sys.argv[0])}: stopped by {name(sig)} {when}", file=sys.stderr, flush=True)
    os._exit(exit_code(sig))


def alive(pid):
    """Whether process pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True

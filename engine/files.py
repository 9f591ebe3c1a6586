"""
The files that runs and datasets leave on disk, written so that nothing is lost: writes that are whole or absent,
and the lock that lets one run at a time use a folder. Imports only the standard library: data.py and plot.py
use it without loading torch.

`claim(out_dir)` takes a run folder's lock before the run's first write and holds it until the process ends;
`held_by(out_dir)` says which process holds a folder. `append_line` adds a line to a log,
`write_atomic` writes config.json and the checkpoints, and `write_and_sync` the prepared data; `read_own` and
`read_json` read them back. A write that fails
(disk full, a read-only filesystem) is a WriteError naming the file and the cause, with the file as it was before:
one line, exit code 1. Every file nanonorm opens in its own folders goes through `open_own`, which takes only a
regular file: never one through a symlink (a link at run.lock would have the lock truncate whatever it points to),
never a FIFO (its open or read waits forever); anything else is a UsageError naming it, exit code 2.
"""

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat

from engine.flags import UsageError

LOCK = "run.lock"  # in every run folder; it stays there (removing it would let two runs lock two different files)


class WriteError(Exception):
    """A file could not be written (disk full, read-only filesystem, I/O error): printed as one line, exit code 1.
    What the file held before the write is kept."""


def cannot_write(path, error):
    return WriteError(f"cannot write {path} ({error.strerror or error})")


class NotAFile(UsageError):
    """Something other than a regular file where nanonorm opens one of its own files: a symlink, a folder, a FIFO,
    a socket or a device. Bad input: one line, exit code 2, and the thing at path is left as it is."""

    def __init__(self, path, problem):
        super().__init__(f"{path} is {problem}; nanonorm opens its own files only as regular files, never through a "
                         "link: remove it, or choose another folder")


def not_own_file(path):
    """Why path cannot be opened as one of nanonorm's own files (one phrase), or None where it can: not_a_file's
    reasons, and a symlink to a file too, since nanonorm follows no link to its own files."""
    problem = not_a_file(path)
    if not problem and os.path.islink(path):
        return f"a symlink to {os.readlink(path)}"
    return problem


def open_own(path, flags, mode=0o666):
    """The file descriptor of path opened with os.open's flags where path is (or, with O_CREAT, becomes) a regular
    file; as open's opener, open(path, "wb", opener=open_own). O_NOFOLLOW refuses a symlink in path's last place,
    and O_NONBLOCK makes the open of a FIFO return at once (ENXIO for a write with no reader, else the FIFO, which
    fstat then tells apart) instead of waiting for its other end forever. Anything but a regular file is a
    NotAFile; any other failure is the OSError."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        problem = e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR) and not_own_file(path)
        if problem:
            raise NotAFile(path, problem) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAFile(path, not_own_file(path) or "not a regular file")
    os.set_blocking(fd, True)  # a regular file never blocks: the flag is dropped for the reads and writes
    return fd


def read_own(path):
    """The bytes of one of nanonorm's own files (open_own): a missing one is FileNotFoundError."""
    with open(path, "rb", opener=open_own) as f:
        return f.read()


def parse_json(text):
    """json.loads, with a file nested deeper than Python's recursion limit ('[' * 100000) a ValueError like any other
    text that is not JSON nanonorm wrote (json.loads raises RecursionError on it), and so is an integer past 2^63,
    which nanonorm never writes (a step, a count, a seed) and which a reader would take for a number and overflow on
    (math.isfinite(10**400)). Every JSON reader of nanonorm's files reads through it."""
    try:
        return json.loads(text, parse_int=integer)
    except RecursionError:
        raise ValueError("nested too deeply to be JSON nanonorm wrote") from None


def integer(text):
    """A JSON integer as parse_json reads it: within (-2^63, 2^63), else a ValueError."""
    value = int(text)
    if abs(value) >= 2 ** 63:
        raise ValueError(f"an integer of {len(text)} digits, past 2^63: not JSON nanonorm wrote")
    return value


def read_json(path):
    """One of nanonorm's own JSON files (read_own, then parse_json)."""
    return parse_json(read_own(path))


def write_and_sync(path, content):
    """content as the file at path, flushed to the disk: bytes (or an array), or a function that writes to the
    open binary file (torch.save of a checkpoint). Not atomic by itself: write_atomic renames the file into place,
    data.py renames the folder that holds it."""
    with open(path, "wb", opener=open_own) as f:
        if callable(content):
            content(f)
        else:
            f.write(content)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path, content, tmp=None):
    """content (as write_and_sync takes it) as the file at path, whole or not at all: written to a temporary file
    beside it (tmp, by default one per process), flushed to the disk, then renamed over path, and the rename
    flushed too. Any failure, Ctrl-C included, removes the temporary file; an OSError is a WriteError naming
    path, anything else is raised as it is."""
    tmp = tmp or f"{path}.{os.getpid()}.tmp"
    try:
        write_and_sync(tmp, content)
        os.replace(tmp, path)
        folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself reaches the disk
        finally:
            os.close(folder)
    except NotAFile:
        raise  # something other than nanonorm's temporary file is there: it is left as it is
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise cannot_write(path, e) from None
        raise


def append_line(path, line):
    """line (text ending in a newline) appended to path, whole or not at all: a write cut short (the disk filled
    up, a second Ctrl-C) is cut back off, so the file keeps its old lines and gains no torn one."""
    data = memoryview(line.encode())
    try:
        fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        size = os.fstat(fd).st_size
        while data:
            data = data[os.write(fd, data):]
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        if isinstance(e, OSError):
            raise cannot_write(path, e) from None
        raise
    finally:
        os.close(fd)


def not_a_folder(path):
    """Why an existing path is no folder to write in (one phrase), or None where it is one."""
    return None if os.path.isdir(path) else not_a_file(path) or "a file, not a folder"


def not_a_file(path):
    """Why path cannot be read as a plain file (one phrase), or None where it can; a missing path is None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"a symlink to {os.readlink(path)}, which does not exist" if os.path.islink(path) else None
    except OSError as e:
        return "in a symlink loop" if e.errno == errno.ELOOP else f"unreadable ({e.strerror})"
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device, which could block a read forever)"
    return None


def too_long(path):
    """Why the filesystem would refuse path as too long (a name past NAME_MAX, the whole past PATH_MAX, less room for
    the names a run writes in it), or None: said before any work, not at the first write."""
    path = os.path.abspath(path)
    where = nearest_existing(path)
    room = len("/ckpt-000000000.pt.000000000.tmp")  # the longest name a run writes in its folder
    try:
        name_max, path_max = os.pathconf(where, "PC_NAME_MAX"), os.pathconf(where, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max(path.split(os.sep), key=len)
    if len(longest.encode()) > name_max:
        return f"a name in it is {len(longest.encode())} bytes long, and this filesystem allows {name_max}"
    if len(path.encode()) + room > path_max:
        return f"the path is {len(path.encode())} bytes long, and this filesystem allows {path_max - room} for a folder"
    return None


def check_out_folder(out, contents, example):
    """--out is a folder, or a path that can become one: not empty, not a file, not under a file; a UsageError
    naming it otherwise. contents: what goes in the folder; example: a folder to suggest."""
    if not out:
        raise UsageError(f"--out is empty; give the folder {contents} go to (it is made if absent), such as "
                         f"--out={example}")
    existing = nearest_existing(out)
    if not os.path.isdir(existing):
        what = not_a_file(existing) or "a file"
        where = "" if existing == os.path.normpath(out) else f" is under {existing}, which"
        raise UsageError(f"--out={out}{where} is {what}; give the folder {contents} go to (it is made if absent)")


def nearest_existing(path):
    """path itself where anything is there (a symlink that leads nowhere counts), else the nearest path above it
    that exists: what decides whether path is, or can become, a folder."""
    path = os.path.normpath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path) or "."
    return path


def holder(lock):
    """Who holds a lock file, from what its holder wrote into it."""
    lock.seek(0)
    pid, _, host = lock.read().strip().partition(" ")
    return f"PID {pid} on {host}" if pid.isdigit() else "a process that has not written its PID yet"


def in_use(out_dir, who, user="a run"):
    return UsageError(f"--out_dir={out_dir} is in use by {user} ({who}); wait for it to end or stop it, or choose "
                      "another --out_dir")


def held_by(out_dir):
    """The process holding out_dir's lock ("PID 123 on host"), or None when no process does; a lock that is not a
    regular file (a symlink, a FIFO) is a NotAFile. Writes nothing."""
    try:
        lock = open(os.path.join(out_dir, LOCK), opener=open_own)  # read-only: flock needs only an open file
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two processes may look at once
        except BlockingIOError:
            return holder(lock)
    return None


def claim(out_dir, name=LOCK, user="a run"):
    """out_dir's lock for this process, or a UsageError naming the process that holds it. Keep the returned file
    open for the life of the run: the lock is the kernel's (flock), released when the process ends, however it
    ends (kill -9 included), so no run is ever blocked by one that is gone. The holder's PID and host are written
    into the lock file for held_by. name, user: the lock file and who holds it (a sweep's folder has its own)."""
    path = os.path.join(out_dir, name)
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(path, "a+", opener=open_own)  # not truncated until it is ours: the holder's PID stays readable
    except OSError as e:
        raise cannot_write(path, e) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = holder(lock)
        lock.close()
        raise in_use(out_dir, who, user) from None
    try:
        lock.truncate(0)
        lock.write(f"{os.getpid()} {socket.gethostname()}\n")
        lock.flush()
    except OSError as e:
        with contextlib.suppress(OSError):  # close flushes the text that failed again, and fails again
            lock.close()
        raise cannot_write(path, e) from None
    return lock

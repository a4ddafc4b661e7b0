"""A commit signal for a SQLite file: the kernel says when the file or its WAL was
written (Linux inotify on the file's directory), so a commit watcher
(``quickzones.store.changes``) sleeps until a commit may have been made instead of
reading ``PRAGMA data_version`` every few milliseconds (issue 44 point 4: an idle worker
costs nothing).

Every commit writes the WAL (``-wal``) with write(2), or the file itself in rollback
journal mode; inotify reports each such write (not the ``-shm`` index, written through
mmap). A hint only, as PostgreSQL's NOTIFY: the watcher still reads the counter (whose
commit it was: this process's own commits wake it too, and say nothing new), and still
reads it at its slow tick, so a signal lost (the kernel's event queue overflowed, a
filesystem that reports nothing: NFS, some FUSE mounts) costs at most that tick.

The directory is watched rather than the files, so a WAL created or deleted meanwhile
(the last connection's close removes it) is still seen; only events naming the file,
its ``-wal`` or ``-journal`` count. Elsewhere than Linux (no inotify) :func:`open_signal`
returns None and the watcher polls at ``commit_poll_s`` as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import math
import os
import select
import struct
import sys
import threading
import time

# inotify(7)
_IN_MODIFY = 0x00000002
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_BYTES = 64 * 1024


class FileSignal:
    """An inotify descriptor watching a SQLite file's directory for writes to the file,
    its WAL or its journal. One commit watcher thread waits on it (two would each take
    some of the other's events); :meth:`close` may come from any thread."""

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        # Reads and the close exclude each other: a descriptor closed by the store's
        # close() is never read after (its number may belong to another file by then).
        self._lock = threading.Lock()
        self._closed = False

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for a write to the file; True when one was seen
        (since the last call, or during this one)."""
        end = time.monotonic() + timeout_s
        while not self._drain():
            # Writes to other files of the directory (logs, say) wake the poll too: wait
            # on for the rest of the timeout.
            left = end - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(InterruptedError):
                self._poll.poll(max(1, math.ceil(left * 1000)))
        return True

    def _drain(self) -> bool:
        """Read every queued event; True if one names the file (or events were lost, or
        the signal was closed: the caller reads the counter and learns the store's fate)."""
        with self._lock:
            return self._closed or self._drain_open()

    def _drain_open(self) -> bool:
        seen = False
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                return seen
            except OSError as err:
                if err.errno == errno.EINTR:
                    continue
                return True  # the descriptor failed: say "maybe", the caller reads
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + size].rstrip(b"\0")
                offset += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW or name in self._names:
                    seen = True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                os.close(self._fd)


def open_signal(path: str) -> FileSignal | None:
    """A :class:`FileSignal` for the SQLite file at ``path``, or None where the platform
    cannot (not Linux, no libc, inotify limits reached)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    fd = init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    absolute = os.path.abspath(path)
    directory, base = os.path.split(os.fsencode(absolute))
    if add_watch(fd, directory or b".", _MASK) < 0:
        os.close(fd)
        return None
    names = frozenset({base, base + b"-wal", base + b"-journal"})
    return FileSignal(fd, names)

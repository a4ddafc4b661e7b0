"""Noticing that the SQLite file was deleted or replaced under a running process.

SQLite keeps using the inode it opened: a process whose file was deleted (or renamed over
by another) goes on reading and writing a file nobody else sees, and items enqueued into
the new file at that path wait for a consumer that never looks (issue 28, point 6). The
store compares the path's device and inode with the ones it opened at most once per
:data:`CHECK_INTERVAL_S` (one ``stat``), as it hands out a connection, and from then on
refuses every transaction with :class:`~quickzones.errors.StoreLost`.
"""

from __future__ import annotations

import os
import threading
import time

from quickzones.errors import StoreLost

# How often the path is checked: a stat a second per process, nothing on the hot path.
CHECK_INTERVAL_S = 1.0


class FileIdentity:
    """The (device, inode) of the file at ``path`` when the store opened it."""

    def __init__(self, path: str, url: str, *, interval_s: float = CHECK_INTERVAL_S) -> None:
        self.path = os.path.abspath(path)  # as opened: a later chdir changes nothing
        self.url = url
        self.interval_s = interval_s
        self._opened: tuple[int, int] | None = None  # until opened(): nothing to compare
        self._next_check = time.monotonic() + interval_s
        self._lost: StoreLost | None = None
        self._lock = threading.Lock()

    def opened(self) -> None:
        """The store has opened (or created) its file: remember which one it is."""
        self._opened = self._identity()

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def check(self, *, now: bool = False) -> None:
        """Raise :class:`StoreLost` if the file at the path is not the one opened (checked
        at most once per interval, or ``now``, as a new connection is opened by path;
        once lost, always lost)."""
        if self._lost is not None:
            raise self._lost
        at = time.monotonic()
        if (at < self._next_check and not now) or self._opened is None:
            return
        with self._lock:
            self._next_check = at + self.interval_s
            now_there = self._identity()
            if now_there == self._opened or self._lost is not None:
                return
            what = "deleted" if now_there is None else "replaced by another file"
            self._lost = StoreLost(
                self.url, f"its file {self.path} was {what} while this process had it open"
            )
        raise self._lost

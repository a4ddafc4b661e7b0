"""Which commits to a SQLite file one store object did not make: its commit counter
(``SQLiteStore.data_version``, the :class:`~quickzones.store.kv.CommitCounter` capability).

``PRAGMA data_version`` changes after a commit by any other connection, and a store's own
commits come from its pooled connections, so read alone it would wake a process's idle
consumer after every one of that process's own completions and visits: under load, a
rescan after each. Each commit records its version in ``quick_conflicts``; when the
pragma changed, the versions newer than the last one looked at tell whether any was not
this store's. A commit that records no version (the application's own tables only)
changed nothing a consumer or a long poll waits for.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque

_VERSION = "SELECT version FROM quick_meta WHERE id = 0"
_VERSIONS_AFTER = "SELECT version FROM quick_conflicts WHERE version > ?"

# Own versions remembered: the watcher looks every few ms, a handful of commits each time.
KEEP = 4096


class ForeignCommits:
    """Counts the commits of quick's data made by anyone but this store."""

    def __init__(self, keep: int = KEEP) -> None:
        self._lock = threading.Lock()
        self._own: set[int] = set()
        self._order: deque[int] = deque()
        self._keep = keep
        self._data_version: int | None = None
        self._seen = 0  # the newest commit version looked at
        self.count = 0

    def made(self, version: int) -> None:
        """This store is committing ``version`` (called before its COMMIT, so a watcher
        that sees the commit already knows it)."""
        with self._lock:
            self._own.add(version)
            self._order.append(version)
            if len(self._order) > self._keep:
                self._own.discard(self._order.popleft())

    def poll(self, conn: sqlite3.Connection) -> int:
        """The count now, read through ``conn`` (a connection of the caller's that never
        writes; one caller at a time)."""
        data_version: int = conn.execute("PRAGMA data_version").fetchone()[0]
        if data_version == self._data_version:
            return self.count
        first = self._data_version is None
        self._data_version = data_version
        if first:
            self._seen = conn.execute(_VERSION).fetchone()[0]
            return self.count
        versions = [v for (v,) in conn.execute(_VERSIONS_AFTER, (self._seen,))]
        if versions:
            self._seen = max(versions)
            with self._lock:
                if any(v not in self._own for v in versions):
                    self.count += 1
        return self.count

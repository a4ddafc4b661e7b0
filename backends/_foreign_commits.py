"""Which commits to a shared store one store object did not make: the count behind a
store's commit counter (``data_version``, the :class:`~quickzones.store.kv.CommitCounter`
capability) on SQLite and PostgreSQL.

A store's own commits come from its pooled connections, and its process's consumers hear
of them directly (an enqueue wakes them; a visit or completion needs no wake-up), so a
counter that changed on them would wake a process's idle consumer after every one of that
process's own completions and visits: under load, a rescan after each. Each commit records
its version (in ``quick_conflicts``, both stores); the versions newer than the last one
looked at tell whether any was not this store's. A commit that records no version (the
application's own tables only) changed nothing a consumer or a long poll waits for.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

# Own versions remembered: the watcher looks every few ms, a handful of commits each time.
KEEP = 4096


class ForeignCommits:
    """Counts the commits of quick's data made by anyone but this store."""

    def __init__(self, keep: int = KEEP) -> None:
        self._lock = threading.Lock()
        self._own: set[int] = set()
        self._order: deque[int] = deque()
        self._keep = keep
        self.seen: int | None = None  # the newest commit version looked at
        self.count = 0

    def made(self, version: int) -> None:
        """This store made the commit of ``version`` (called before its COMMIT where the
        store can, else right after: a watcher that saw it first wakes once for nothing)."""
        if self.seen is None:
            # Nobody watches yet (a producer's process): the first look counts only the
            # commits after the newest it finds, so this one is never asked about (one
            # racing that look is at worst taken for another's: one wake-up for nothing).
            return
        with self._lock:
            self._own.add(version)
            self._order.append(version)
            if len(self._order) > self._keep:
                self._own.discard(self._order.popleft())

    def start(self, version: int) -> int:
        """The first look: count from the commit of ``version`` (the newest) on."""
        self.seen = version
        return self.count

    def saw(self, versions: Sequence[int]) -> int:
        """The commit versions newer than :attr:`seen` (one caller at a time); the count
        now, one more if any of them was not this store's."""
        newest = max(versions, default=None)
        if newest is not None:
            self.seen = newest
            with self._lock:
                if any(v not in self._own for v in versions):
                    self.count += 1
        return self.count

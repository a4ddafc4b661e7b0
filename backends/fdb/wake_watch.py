"""Wake-ups on FoundationDB: a watch on one key that enqueues bump (issue 44 point 4).

An idle consumer would otherwise find another process's enqueue only by peeking the
top-level queue every ``idle_sleep_s`` (about 5 % of a core). Here an enqueue that makes a
zone's pointer or pulls it earlier (:func:`quickzones.store.kv.wake_watchers`: the zone
has work now) adds 1 to a counter key in the same transaction, an atomic add that
conflicts with nothing; one thread per store keeps a watch on that key and counts its
changes. That count is the store's :class:`~quickzones.store.kv.CommitCounter`
(``data_version``, read from memory) and ``wait_for_commits`` sleeps until it moves, so
:mod:`quickzones.store.changes` wakes idle consumers and long polls on it and otherwise
polls only at its slow safety tick.

Only enqueues that make a zone active bump the key, never one into a zone that already
has a pointer vesting in time, so its write rate is the rate at which idle zones get work,
not the enqueue rate. A watch only says that the value changed since it was read (an atomic
add never returns to an earlier value, so no change is missed, docs/fdb-semantics.md
section 6); the thread then reads it again and sets the next watch. While the cluster cannot
be reached the thread retries with a capped backoff and :attr:`WakeWatch.signalled` is
False, so watchers fall back to their short tick.
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

from quickzones.repeated_failure import RepeatedFailure, backoff
from quickzones.store.tuple_layer import fdbtuple

log = logging.getLogger("quick.fdb.wake")

# Outside the core's ("quick", ...) keys, under the store's prefix.
WAKE_KEY = fdbtuple.pack(("quick-wake",))
ONE = struct.pack("<q", 1)
FIRST_WATCH_S = 2.0  # how long data_version() waits for the thread's first watch
OPERATION_CANCELLED = 1101
RETRY_CAP_S = 2.0


class WakeWatch:
    """The count of changes of the store's wake key seen by a watch, kept by a thread
    started on the first :meth:`count` (producers never start one)."""

    def __init__(self, db: Any, key: bytes, error_type: type[BaseException]) -> None:
        self._db = db
        self.key = key
        self._error_type = error_type
        self._cond = threading.Condition()
        self._count = 0
        self._waited = 0  # the count when the last wait() returned
        self._watching = False  # a watch is set on the value last read
        self._started = False
        self._closed = False
        self._future: Any = None
        self.failures = RepeatedFailure(
            log,
            "wake key watch",
            level=logging.WARNING,
            failing="the wake key's watch fails; idle consumers poll meanwhile",
            recovered="the wake key is watched again",
        )

    def count(self) -> int:
        """Changes of the wake key seen so far. The first call starts the thread and waits
        (briefly) until its first watch is set, so a bump made after this returns is never
        missed."""
        with self._cond:
            if not self._started:
                self._started = True
                threading.Thread(target=self._loop, name="quick-fdb-wake", daemon=True).start()
                self._cond.wait_for(lambda: self._watching or self._closed, FIRST_WATCH_S)
            return self._count

    @property
    def signalled(self) -> bool:
        """Whether a change of the key wakes :meth:`wait` now (a watch is set)."""
        return self._watching and not self._closed

    def wait(self, timeout_s: float) -> None:
        """Return when the count moved since the last wait returned (at once if it moved
        meanwhile: a bump between a watcher's read and its wait is not slept through), or
        after ``timeout_s``."""
        with self._cond:
            self._cond.wait_for(lambda: self._count != self._waited or self._closed, timeout_s)
            self._waited = self._count

    def close(self) -> None:
        with self._cond:
            self._closed = True
            future, self._future = self._future, None
            self._cond.notify_all()
        if future is not None:
            try:
                future.cancel()
            except self._error_type:
                pass

    def _loop(self) -> None:
        seen: bytes | None = None
        first = True
        while not self._closed:
            try:
                tr = self._db.create_transaction()
                value = tr.get(self.key).wait()
                current = bytes(value) if value.present() else None
                future = tr.watch(self.key)
                tr.commit().wait()  # a watch is set once its transaction commits
                with self._cond:
                    if self._closed:
                        future.cancel()
                        return
                    self._future = future
                    self._watching = True
                    if not first and current != seen:
                        self._count += 1
                    self._cond.notify_all()
                seen, first = current, False
                self.failures.succeeded()
                future.wait()
                # Changed: waiters rescan now, not after the next read and watch (two
                # round trips). A change made after their rescan read but before that
                # read is counted there again (the value read differs from ``seen``).
                with self._cond:
                    self._count += 1
                    self._cond.notify_all()
            except self._error_type as err:
                if self._closed or getattr(err, "code", None) == OPERATION_CANCELLED:
                    continue
                failures = self.failures.failed(err)
                with self._cond:
                    self._watching = False
                    # A change may have gone unseen: waiters rescan.
                    self._count += 1
                    self._cond.notify_all()
                    self._cond.wait_for(
                        lambda: self._closed, backoff(failures, base_s=0.05, cap_s=RETRY_CAP_S)
                    )

"""What runs once an application's own transaction has committed: part two of the enqueues
it made through ``Quick.enqueue_on`` (pulling an idle pointer's vesting time earlier).

Part two reads the zone's pointer record with a conflict, so inside the application's
transaction it would hold that record's lock until the application's COMMIT, and every
consumer leasing the pointer would wait for the application (issue 42). Run before the
COMMIT, in a transaction of its own, it could pull the pointer earlier while the item is
not yet visible, and a consumer visiting the zone meanwhile would put the pointer back to
the zone's later items. So it runs after the COMMIT, as on FoundationDB. psycopg has no
hook for another's COMMIT, but the application's transaction holds the advisory locks of
the keys quick wrote in it until it ends: a thread of the store waits for one of them (the
new item's own, which no other open transaction holds), shared, and then asks the server
the status of every pending transaction (``pg_xact_status``, one query), runs the
callbacks of those committed and drops those of those rolled back. The wait ends with the
COMMIT (no server work meanwhile, where asking every 3 ms was one query each time for as
long as any transaction was open); it gives up after :data:`WAIT_MS` so that one long
transaction delays the others' part two by that much at most, and one still open after
:data:`SLOW_WAITS` waits goes to the back of the line. A transaction with no such lock
(or whose lock came free while it is still open: the application rolled back to a
savepoint of its own) is asked about every :data:`POLL_S`.
Part two is best effort, as everywhere: a process that dies before it runs leaves the item
to vest when the pointer does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from quickzones.clock import Clock

log = logging.getLogger(__name__)

# Between two asks of the server while a transaction without a lock to wait on is pending.
POLL_S = 0.003
# The longest one wait for a pending transaction's lock (then every pending one is asked
# about, and the first in line is waited for again).
WAIT_MS = 20
# Waits that gave up before the first in line goes to the back: the oldest transaction
# usually ends first (waiting for a younger one would leave the oldest's COMMIT unheard
# until that wait ends), but a slow one (a request held open) should not keep the others
# from being heard at once.
SLOW_WAITS = 10
# Transactions remembered at most (the oldest are dropped: part two is best effort).
MOST_PENDING = 100_000

_STATUSES = "SELECT x, pg_xact_status(x::xid8) FROM unnest(%s::text[]) x"
_WAITED_STATUSES = (
    "WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true)),"
    " l AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(%s::int, %s::int) FROM t)"
    " SELECT x, pg_xact_status(x::xid8) FROM l, unnest(%s::text[]) x"
)


@dataclass(slots=True)
class _Pending:
    callbacks: list[Callable[[], None]]
    # An advisory lock the transaction holds exclusively until it ends (None: none known).
    lock: int | None
    # Waits for it that gave up since it was last put at the back of the line.
    waits: int = 0


class AfterCommit:
    """Callbacks to run once given PostgreSQL transactions (by id) have committed."""

    def __init__(
        self,
        acquire: Callable[[], Any],
        release: Callable[[Any], None],
        clock: Clock,
        space: int = 0,
    ) -> None:
        self._acquire = acquire
        self._release = release
        self._clock = clock
        self._space = space
        self._cond = threading.Condition()
        self._pending: dict[str, _Pending] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        # Status queries sent (each answers for every pending transaction).
        self.asks = 0

    def add(self, xid: str, callbacks: list[Callable[[], None]], lock: int | None = None) -> None:
        """Run ``callbacks`` once transaction ``xid`` has committed (never if it rolls
        back). ``lock``: an advisory lock (in the store's space) that ``xid`` holds
        exclusively until it ends."""
        with self._cond:
            if self._closed:
                return
            pending = self._pending.setdefault(xid, _Pending([], lock))
            pending.callbacks.extend(callbacks)
            if pending.lock is None:
                pending.lock = lock
            while len(self._pending) > MOST_PENDING:
                self._pending.pop(next(iter(self._pending)))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="quick-pg-after-commit", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _next(self) -> tuple[list[str], str | None, int | None] | None:
        """Every pending transaction, and the first in line with a lock to wait for."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            for xid, pending in self._pending.items():
                if pending.lock is not None:
                    return list(self._pending), xid, pending.lock
            return list(self._pending), None, None

    def _run(self) -> None:
        while True:
            wanted = self._next()
            if wanted is None:
                return
            xids, waited, lock = wanted
            try:
                statuses, timed_out = self._statuses(xids, lock)
            except Exception as err:  # the server away: ask again after a while
                log.debug("pg_xact_status failed: %s", err)
                self._clock.sleep(0.2)
                continue
            ready: list[Callable[[], None]] = []
            with self._cond:
                for xid, status in statuses.items():
                    if status == "in progress":
                        continue
                    pending = self._pending.pop(xid, None)
                    if pending is not None and status == "committed":
                        ready.extend(pending.callbacks)
                if waited is not None and waited in self._pending:
                    self._waited(waited, timed_out)
            for callback in ready:
                try:
                    callback()
                except Exception as err:  # best effort, as part two is everywhere
                    log.debug("a callback after an application's commit failed: %s", err)
            if not ready and lock is None:
                self._clock.sleep(POLL_S)

    def _waited(self, xid: str, timed_out: bool) -> None:
        """After a wait for ``xid``'s lock, ``xid`` still open (under the condition)."""
        pending = self._pending[xid]
        if not timed_out:
            pending.lock = None  # free while the transaction is open: poll it
            return
        pending.waits += 1
        if pending.waits >= SLOW_WAITS:  # a slow one: the others first
            pending.waits = 0
            self._pending[xid] = self._pending.pop(xid)

    def _statuses(self, xids: list[str], lock: int | None) -> tuple[dict[str, str | None], bool]:
        """The status of each of ``xids``, asked once ``lock`` came free (at most
        :data:`WAIT_MS` later), and whether that wait gave up."""
        conn = self._acquire()
        timed_out = False
        try:
            if lock is None:
                rows = conn.execute(_STATUSES, (xids,), prepare=False).fetchall()
            else:
                try:
                    rows = self._after_lock(conn, xids, lock)
                except psycopg.errors.LockNotAvailable:
                    timed_out = True
                    rows = conn.execute(_STATUSES, (xids,), prepare=False).fetchall()
        finally:
            self._release(conn)
        self.asks += 1
        return {str(x): status for x, status in rows}, timed_out

    def _after_lock(self, conn: Any, xids: list[str], lock: int) -> list[tuple[Any, ...]]:
        """One statement, in a transaction of its own: wait (shared) for the lock, then
        ask. The CTEs run in order (each reads the one before, and the statuses are
        computed from rows joined with the lock's), so ``lock_timeout`` bounds the wait
        and the statuses are read after it; the lock goes with the statement."""
        rows: list[tuple[Any, ...]] = conn.execute(
            _WAITED_STATUSES, (f"{WAIT_MS}ms", self._space, lock, xids), prepare=False
        ).fetchall()
        return rows

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()

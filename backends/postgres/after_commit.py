"""What runs once an application's own transaction has committed: part two of the enqueues
it made through ``Quick.enqueue_on`` (pulling an idle pointer's vesting time earlier).

Part two reads the zone's pointer record with a conflict, so inside the application's
transaction it would hold that record's lock until the application's COMMIT, and every
consumer leasing the pointer would wait for the application (issue 42). Run before the
COMMIT, in a transaction of its own, it could pull the pointer earlier while the item is
not yet visible, and a consumer visiting the zone meanwhile would put the pointer back to
the zone's later items. So it runs after the COMMIT, as on FoundationDB: psycopg has no
hook for another's COMMIT, so a thread asks the server for the status of the
application's transaction (``pg_xact_status``, one query for all that are pending) every
few milliseconds while any is pending, runs the callbacks of those committed and drops
those of those rolled back. Part two is best effort, as everywhere: a process that dies
before it runs leaves the item to vest when the pointer does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from quickzones.backends.postgres import wire
from quickzones.clock import Clock

log = logging.getLogger(__name__)

# Between two asks of the server while a transaction is pending.
POLL_S = 0.003
# Transactions remembered at most (the oldest are dropped: part two is best effort).
MOST_PENDING = 100_000
# How long close() waits for the callbacks under way (those of transactions not seen
# committed yet are dropped).
CLOSE_WAIT_S = 10.0


class AfterCommit:
    """Callbacks to run once given PostgreSQL transactions (by id) have committed."""

    def __init__(
        self,
        acquire: Callable[[], Any],
        release: Callable[[Any], None],
        clock: Clock,
        statement: bytes,
    ) -> None:
        # The status query (sql.Statements.XACT_STATUS, for wire.py).
        self._statement = statement
        self._acquire = acquire
        self._release = release
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: dict[str, list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, xid: str, callbacks: list[Callable[[], None]]) -> None:
        """Run ``callbacks`` once transaction ``xid`` has committed (never if it rolls
        back)."""
        with self._cond:
            if self._closed:
                return
            self._pending.setdefault(xid, []).extend(callbacks)
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

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                xids = list(self._pending)
            try:
                statuses = self._statuses(xids)
            except Exception as err:  # the server away: ask again after a while
                log.debug("pg_xact_status failed: %s", err)
                self._clock.sleep(0.2)
                continue
            ready: list[Callable[[], None]] = []
            with self._cond:
                for xid, status in statuses.items():
                    if status == "in progress":
                        continue
                    callbacks = self._pending.pop(xid, [])
                    if status == "committed":
                        ready.extend(callbacks)
            for callback in ready:
                if self._closed:
                    break
                try:
                    callback()
                except Exception as err:  # best effort, as part two is everywhere
                    log.debug("a callback after an application's commit failed: %s", err)
            if not ready:
                self._clock.sleep(POLL_S)

    def _statuses(self, xids: list[str]) -> dict[str, str | None]:
        conn = self._acquire()
        try:
            asked = (self._statement, (wire.texts(xids),), False)
            rows = wire.exchange(conn, (asked,))[0].fetchall()
        finally:
            self._release(conn)
        return {x.decode(): None if status is None else status.decode() for x, status in rows}

    def close(self) -> None:
        """Run no more callbacks, and wait for those under way (up to
        :data:`CLOSE_WAIT_S`): nothing of the store's runs after its close returns, so
        the application may drop the schema next."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_S)

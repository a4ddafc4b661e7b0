"""What runs once an application's own transaction has committed: part two of the enqueues
it made through ``Quick.enqueue_on`` (pulling an idle pointer's vesting time earlier).

Part two reads the zone's pointer record with a conflict, so inside the application's
transaction it would hold that record's lock until the application's COMMIT, and every
consumer leasing the pointer would wait for the application (issue 42). Run before the
COMMIT, in a transaction of its own, it could pull the pointer earlier while the item is
not yet visible, and a consumer visiting the zone meanwhile would put the pointer back to
the zone's later items. So it runs after the COMMIT, as on FoundationDB: psycopg has no
hook for another's COMMIT, so a thread asks the server for the status of the
application's transactions (``pg_xact_status``, one query for all that are pending) every
few milliseconds while any is pending, runs the callbacks of those committed and drops
those of those rolled back.

One thread serves every request of the process, so a round does at once what the rounds'
transactions share: the keys their part twos read (:class:`SettledRead`) in one statement,
and a callback registered by many (the NOTIFY that wakes idle consumers) once. One
statement a transaction and one round trip each left it behind a producer at 780
transactions a second: its line grew for as long as the producers ran.

Part two is best effort, as everywhere: a process that dies before it runs leaves the item
to vest when its pointer does. A process that closes its store runs the part twos of every
transaction seen committed by then (up to :data:`CLOSE_WAIT_S`) before close returns; so
does one whose interpreter ends without a close (a web worker recycled, a script's end),
from an ``atexit`` hook.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from quickzones.backends.postgres import wire
from quickzones.clock import Clock

log = logging.getLogger(__name__)

# Between two asks of the server while a young transaction is pending: at least this,
# at most the slowest, else a tenth of the youngest pending transaction's age.
POLL_S = 0.003
SLOWEST_POLL_S = 0.05
POLL_AGE_SHARE = 0.1
# Transactions remembered at most (the oldest are dropped: part two is best effort).
MOST_PENDING = 100_000
# How long close() waits for the callbacks of the transactions committed by then.
CLOSE_WAIT_S = 10.0
# Keys one statement of a round reads at most.
KEYS_PER_READ = 500

# Reads the values of keys once the commits in flight on them have ended
# (PostgresStore.read_settled).
ReadSettled = Callable[[Sequence[bytes]], list[bytes | None]]


def _close_at_exit(ref: weakref.ReferenceType[AfterCommit]) -> None:
    after = ref()
    if after is not None:
        after.close()


class SettledRead:
    """Keys a callback reads once its transaction has committed. The round that runs the
    callback reads every such key of the round in one statement and fills
    :attr:`values` first; a read the round could not make is left None (the callback then
    reads alone)."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: Sequence[bytes]) -> None:
        self.keys = list(keys)
        self.values: list[bytes | None] | None = None


class AfterCommit:
    """Callbacks to run once given PostgreSQL transactions (by id) have committed."""

    def __init__(
        self,
        acquire: Callable[[], Any],
        release: Callable[[Any], None],
        clock: Clock,
        statement: bytes,
        read_settled: ReadSettled,
    ) -> None:
        # The status query (sql.Statements.XACT_STATUS, for wire.py).
        self._statement = statement
        self._acquire = acquire
        self._release = release
        self._clock = clock
        self._read_settled = read_settled
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[list[Callable[[], None]], list[SettledRead]]] = {}
        # When the youngest pending transaction was first registered (monotonic): the
        # pace of the asks follows its age.
        self._youngest_at = 0.0
        self._thread: threading.Thread | None = None
        # Rounds ended (a round: the statuses asked, the callbacks of those committed run),
        # and whether one is under way: settle() waits for two to end.
        self._rounds = 0
        self._in_round = False
        # Status queries sent (bench.enqueue_cost and the tests read it).
        self.asks = 0
        self._closing = False  # close() asked: a last round, then the thread ends
        self._closed = False  # close() is done waiting: nothing more runs
        # Registered with the thread's first start: the interpreter's end closes it.
        self._exit_hook: Callable[[], None] | None = None

    def add(
        self,
        xid: str,
        callbacks: list[Callable[[], None]],
        reads: Sequence[SettledRead],
    ) -> None:
        """Run ``callbacks`` once transaction ``xid`` has committed (never if it rolls
        back), ``reads`` made for them first, with the round's other reads."""
        with self._cond:
            if self._closing:
                return
            if xid not in self._pending:
                self._youngest_at = time.monotonic()
            mine = self._pending.setdefault(xid, ([], []))
            mine[0].extend(callbacks)
            mine[1].extend(reads)
            while len(self._pending) > MOST_PENDING:
                self._pending.pop(next(iter(self._pending)))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="quick-pg-after-commit", daemon=True
                )
                self._thread.start()
                if self._exit_hook is None:
                    # A daemon thread is stopped where it stands at the interpreter's end;
                    # atexit runs first, while it still runs.
                    self._exit_hook = functools.partial(_close_at_exit, weakref.ref(self))
                    atexit.register(self._exit_hook)
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return  # closing, nothing left
                last = self._closing
                xids = list(self._pending)
                self._in_round = True
            try:
                statuses = self._statuses(xids)
            except Exception as err:  # the server away: ask again after a while
                log.debug("pg_xact_status failed: %s", err)
                self._round_ended()
                if last:
                    return
                self._clock.sleep(0.2)
                continue
            ready: list[Callable[[], None]] = []
            reads: list[SettledRead] = []
            with self._cond:
                for xid, status in statuses.items():
                    if status == "in progress":
                        continue
                    callbacks, settled = self._pending.pop(xid, ([], []))
                    if status == "committed":
                        ready.extend(callbacks)
                        reads.extend(settled)
                if last:
                    self._pending.clear()  # still open at close: never run
            if reads:
                self._fill(reads)
            # The same callback registered by many transactions (a NOTIFY, a flush of
            # part twos kept by the callbacks before it) runs once, where it was last
            # registered: after every callback of the round registered before it.
            for callback in reversed(dict.fromkeys(reversed(ready))):
                if self._closed:
                    self._round_ended()
                    return
                try:
                    callback()
                except Exception as err:  # best effort, as part two is everywhere
                    log.debug("a callback after an application's commit failed: %s", err)
            self._round_ended()
            if last:
                return
            if not ready:
                self._wait_for_next_ask(time.monotonic())

    def _wait_for_next_ask(self, asked_at: float) -> None:
        """Until the next ask is due: :data:`POLL_S` after the last while the youngest
        pending transaction is young, a tenth of its age once older (at most
        :data:`SLOWEST_POLL_S`). A transaction registered meanwhile (add() notifies)
        is the youngest: the pace starts again from its age."""
        with self._cond:
            while self._pending and not self._closing:
                now = time.monotonic()
                pace = (now - self._youngest_at) * POLL_AGE_SHARE
                left = asked_at + min(SLOWEST_POLL_S, max(POLL_S, pace)) - now
                if left <= 0:
                    return
                self._cond.wait(left)

    def _round_ended(self) -> None:
        with self._cond:
            self._rounds += 1
            self._in_round = False
            self._cond.notify_all()

    def settle(self, timeout_s: float) -> None:
        """Wait, ``timeout_s`` at most, until the callbacks of every transaction that had
        committed when this was called have run: two rounds ended after the call (the
        one under way may have asked before that COMMIT; the next asked after it). At
        once when nothing is pending. What a consumer of this process runs next then sees
        the items of the application's transactions committed before it (part two)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._rounds + 2
            while (self._pending or self._in_round) and self._rounds < target:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return
                self._cond.wait(left)

    def _fill(self, reads: list[SettledRead]) -> None:
        """Read every key of ``reads`` (once each, a statement per KEYS_PER_READ keys)
        and hand each its values."""
        keys = list(dict.fromkeys(key for read in reads for key in read.keys))
        found: dict[bytes, bytes | None] = {}
        try:
            for start in range(0, len(keys), KEYS_PER_READ):
                chunk = keys[start : start + KEYS_PER_READ]
                found.update(zip(chunk, self._read_settled(chunk), strict=True))
        except Exception as err:  # each callback then reads alone
            log.debug("a read after applications' commits failed: %s", err)
            return
        for read in reads:
            read.values = [found[key] for key in read.keys]

    def _statuses(self, xids: list[str]) -> dict[str, str | None]:
        self.asks += 1
        conn = self._acquire()
        try:
            asked = (self._statement, (wire.texts(xids),), False)
            rows = wire.exchange(conn, (asked,))[0].fetchall()
        finally:
            self._release(conn)
        return {x.decode(): None if status is None else status.decode() for x, status in rows}

    def close(self) -> None:
        """Take no more transactions; run the callbacks of those committed by now, and
        wait for them (up to :data:`CLOSE_WAIT_S`; those of transactions still open are
        dropped): nothing of the store's runs after its close returns, so the
        application may drop the schema next."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
            hook, self._exit_hook = self._exit_hook, None
        if hook is not None:
            atexit.unregister(hook)
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_S)
        with self._cond:
            self._closed = True
            self._pending.clear()

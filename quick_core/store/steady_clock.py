"""A clock that never runs backwards across the processes sharing a store.

Vesting times are absolute wall-clock milliseconds stored in keys (the order index, the
pointer vesting index). When a host's wall clock is set back by H (an administrator, an
NTP step, a VM restored from a snapshot), everything stamped before the step looks H
further away: a dead consumer's 30 s lease would last H + 30 s, a 5 s delay H + 5 s.

:class:`SteadyClock` reads the time as ``max(wall clock, floor + elapsed since the floor
was taken)``, where the floor is the highest time this process, or any process that shares
the store, has read. The store keeps the cluster's floor under one key
``(root, "m", "clock")`` (8-byte little-endian milliseconds, raised by atomic ``max``), so
after a step back time goes on at the real rate from where it was, in every process, and a
process started after the step reads the floor before it stamps anything.

Cost: a lock and two clock readings per :meth:`SteadyClock.now`, and one exchange with the
store per process per :data:`SYNC_PERIOD_S` of elapsed time: a snapshot read and an atomic
``max`` of one key, which add no read conflict and so never conflict with anything.

The first exchange is a caller's: a process knows the floor before it hands out any
time. On a store with a server (PostgreSQL, FoundationDB) each later one runs beside the
callers, on a thread of its own, while they go on with the local floor (as every thread
but the one exchanging always did): made by the reading that found it due, it cost that
caller, an enqueue made a second after the last, a round trip and a commit of its own (on
PostgreSQL seven more writes to the server than the enqueue's one), and a wait on anyone
holding the one key every process shares (:func:`clock_for`).

What it guarantees and what it does not: ``docs/guarantees.md#clock-steps``.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable

from quickzones.clock import Clock, ElapsedClock, SystemClock
from quickzones.errors import ConfigurationError, StorageError
from quickzones.repeated_failure import RepeatedFailure
from quickzones.store.kv import (
    KVStore,
    KVTransaction,
    commits_in_process,
    joins_application_here,
    run,
)

# How often, in elapsed seconds, a process reads the cluster's floor and publishes its own
# time. It bounds how far a process started after a step back can lag the others.
SYNC_PERIOD_S = 1.0

_FLOOR = struct.Struct("<Q")
_log = logging.getLogger(__name__)


def _decode_floor(raw: bytes | None) -> int | None:
    if raw is None or len(raw) != _FLOOR.size:
        return None  # absent, or not written by us: ignore it rather than trust it
    value: int = _FLOOR.unpack(raw)[0]
    return value


class SteadyClock:
    """Wall time that never runs backwards, here or in any process sharing ``kv``.

    ``base`` supplies the wall time (``now``) and the elapsed time (``monotonic``) that no
    step of the wall clock changes; :class:`~quickzones.clock.SystemClock` and
    :class:`~quickzones.clock.ManualClock` do. ``floor_key`` is where the store keeps the
    cluster's floor. Thread-safe. A forward step is followed at once; a backward one is
    absorbed: time keeps its real rate until the wall clock catches up.
    """

    def __init__(
        self,
        kv: KVStore,
        floor_key: bytes,
        base: ElapsedClock,
        *,
        sync_period_s: float = SYNC_PERIOD_S,
        beside: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.base = base
        # Bound once: now() is on every hot path. The system clock's methods only wrap the
        # time module's functions, so call those directly.
        plain = type(base) is SystemClock
        self._wall: Callable[[], float] = time.time if plain else base.now
        self._elapsed: Callable[[], float] = time.monotonic if plain else base.monotonic
        self._kv = kv
        self._key = floor_key
        self._period = sync_period_s
        # Runs the exchanges after the first, beside the callers (a test may pass a runner).
        self._beside = beside or _on_a_thread
        self._lock = threading.Lock()  # guards the floor; held for microseconds
        self._sync_lock = threading.Lock()  # one exchange with the store at a time
        self._floor = base.now()
        self._floor_at = base.monotonic()
        # None until the first exchange: until the store's floor is known, no time is
        # handed out, so a process started after a step back never stamps an hour early.
        self._next_sync: float | None = None
        # A store that refuses the exchange (full, unreachable) is said once per interval.
        self._exchange_failures = RepeatedFailure(
            _log, "exchanging the clock floor with the store", level=logging.WARNING
        )
        _live.add(self)

    def now(self) -> float:
        with self._lock:  # _advance() inlined: this is the hot path
            # Wall first: a pause between the two readings then makes the floor's pair
            # lag (harmless: the wall wins), where the other order moved it ahead for good.
            t = self._wall()
            elapsed = self._elapsed()
            projected = self._floor + (elapsed - self._floor_at)
            if projected > t:
                t = projected
            self._floor, self._floor_at = t, elapsed
            next_sync = self._next_sync
        if next_sync is not None and elapsed < next_sync:
            return t
        if next_sync is not None:
            self._exchange_beside()
            return t
        self._first_sync()
        with self._lock:
            return self._advance()[0]

    def _exchange_beside(self) -> None:
        """Start the exchange that is due beside the callers, unless one is under way, or
        this thread is inside an application's transaction or a native SQL write (where
        the runner is this thread: :meth:`_first_sync`); a later reading makes it."""
        if joins_application_here(self._kv):
            return
        if not self._sync_lock.acquire(blocking=False):
            return
        began = False

        def exchange_and_release() -> None:
            nonlocal began
            began = True
            try:
                self._exchange(beside=True)
            finally:
                self._sync_lock.release()

        try:
            self._beside(exchange_and_release)
        except BaseException:
            if not began:  # no thread could start: the lock is still this reading's
                self._sync_lock.release()
            raise

    def monotonic(self) -> float:
        return self.base.monotonic()

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)

    def _advance(self) -> tuple[float, float]:
        """Move the floor to the current time; the caller holds ``_lock``."""
        wall = self._wall()  # before the elapsed time, as in now()
        elapsed = self._elapsed()
        t = max(wall, self._floor + (elapsed - self._floor_at))
        self._floor, self._floor_at = t, elapsed
        return t, elapsed

    def _first_sync(self) -> None:
        if joins_application_here(self._kv):
            # The exchange would join the application's transaction, and its lock on the
            # floor key (one key every process shares) would last until the application
            # commits: every other process's exchange would wait for it. The next reading
            # outside one exchanges.
            return
        # Before the first exchange every caller waits for it; one makes it.
        with self._sync_lock:
            if self._next_sync is None:  # not made while this one waited
                self._exchange()

    def _exchange(self, beside: bool = False) -> None:
        """Read the store's floor and publish this process's time; the caller holds
        ``_sync_lock``."""
        with self._lock:
            t, _ = self._advance()
        stored = None
        try:
            stored = run(self._kv, _exchange(self._key, int(t * 1000)))
            self._exchange_failures.succeeded()
        except StorageError as err:
            # Time must not stop because the store is unreachable: keep the local floor
            # and try again next period (a closed store ends up here too).
            self._exchange_failures.failed(err)
        except Exception as err:
            if not beside:
                raise
            self._exchange_failures.failed(err)  # beside the callers only the log hears
        finally:
            with self._lock:
                t, elapsed = self._advance()
                if stored is not None and stored / 1000 > t:
                    self._floor = stored / 1000
                self._next_sync = elapsed + self._period


def _in_this_thread(exchange: Callable[[], None]) -> None:
    exchange()


def _on_a_thread(exchange: Callable[[], None]) -> None:
    threading.Thread(target=exchange, name="quick-clock-exchange", daemon=True).start()


# A process forked while one of its threads held a clock's lock would wait forever on it
# (gunicorn's preload, multiprocessing's fork): the child gets fresh locks.
_live: weakref.WeakSet[SteadyClock] = weakref.WeakSet()


def _fresh_locks_after_fork() -> None:
    for clock in list(_live):
        clock._lock = threading.Lock()
        clock._sync_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def _exchange(key: bytes, mine_ms: int) -> Callable[[KVTransaction], int | None]:
    """Read the cluster's floor and raise it to ``mine_ms``: a snapshot read and a blind
    atomic max, so the transaction never conflicts, and running it twice (after
    ``commit_unknown_result``) changes nothing."""

    def exchange(tr: KVTransaction) -> int | None:
        stored = _decode_floor(tr.get(key, snapshot=True))
        tr.max(key, _FLOOR.pack(mine_ms))
        return stored

    return exchange


def clock_for(kv: KVStore, floor_key: bytes, clock: Clock | None, steady: bool | None) -> Clock:
    """The clock a :class:`~quickzones.client.Quick` reads time through.

    ``steady`` None (the default) means steady for the system clock (the default clock,
    or one that subclasses it) and as given for any other clock a caller passes, such as a
    test's ManualClock, whose steps are then the caller's to make.
    """
    base = clock if clock is not None else SystemClock()
    if steady is None:
        steady = isinstance(base, SystemClock)
    if not steady:
        return base
    if not isinstance(base, ElapsedClock):
        raise ConfigurationError(
            f"steady_clock needs a clock with monotonic() (elapsed time that no step of the "
            f"wall clock changes); {type(base).__name__} has none"
        )
    # Beside the callers where an exchange is a server's round trips (PostgreSQL,
    # FoundationDB); where it is not (SQLite, memory), in the reading that finds it due:
    # there a thread of its own cost that caller more than the exchange (SQLite's enqueue
    # made a second after the last, 3.3 against 2.9 ms at the median; its commit waits
    # for the exchange's on the file's one write lock anyway).
    inline = commits_in_process(kv)
    return SteadyClock(kv, floor_key, base, beside=_in_this_thread if inline else None)

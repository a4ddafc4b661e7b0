"""Wake-ups on commits from other processes, for stores that can tell cheaply.

A long poll (``quick serve``'s lease) hears of an enqueue made through its own
:class:`~quickzones.client.Quick` at once (``wake_on_enqueue``); an enqueue made by another
process it would only find at its next periodic scan. A store with the
:class:`~quickzones.store.kv.CommitCounter` capability (SQLite: ``PRAGMA data_version``) says
cheaply whether anything was committed since it was last asked, so one thread per store
asks every millisecond while someone is waiting and calls the waiters back on a change.
The callback is a hint: the waiter rescans and may find nothing new (the commit was
another process's completion, or another app's), so it must stay cheap and bounded (see
:meth:`quickzones.consumer.pull_leaser.PullLeaser.lease`).

FoundationDB feeds the same callbacks from a watch on a key that every enqueue making a
zone active bumps (``quickzones.backends.fdb.wake_watch``); its simulator has no watches,
and its long polls rescan at their period.

Where the store also signals commits (:attr:`CommitWatcher.signalled`: PostgreSQL's
NOTIFY, the kernel's file-change events on a SQLite file), the watcher sleeps on that
signal between reads, so its tick is only a safety poll: a local consumer's idle wait
(``Scanner.idle_wait``) then watches at a third of ``ConsumerConfig.election_ttl_s``
(1.7 s), and an idle worker costs next to nothing (issue 44 point 4). Where it does
not, the idle wait watches at ``ConsumerConfig.commit_poll_s`` (5 ms): it waits for
hours between enqueues, where a 1 ms tick would cost several % of a core.

A read that fails for a while (a PostgreSQL server restarting, its connections
terminated) does not end the watcher: it is logged once per interval with a count
(:class:`~quickzones.repeated_failure.RepeatedFailure`), retried with a capped backoff,
and once a read works again the waiters are called back (they rescan: a commit made
meanwhile is not missed). Before, one failed read ended it for good, and a consumer fell
back to polling at ``idle_sleep_s`` for the rest of its life (issue 40 point 8). Only a
store that is gone (closed, ``StoreLost``, or an error no retry helps) ends it.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from quickzones.errors import StorageError, StoreLost
from quickzones.repeated_failure import RepeatedFailure, backoff
from quickzones.store.kv import commit_counter_of, commit_counter_tick_of, commit_waiter_of

log = logging.getLogger("quick.changes")

TICK_S = 0.001  # how often the counter is read while someone waits
# Where commits are notified: at most one read per this, however many commits there are.
MIN_READ_GAP_S = 0.001
RETRY_CAP_S = 2.0  # the longest wait between reads of a counter that keeps failing


def _transient(err: StorageError) -> bool:
    """A failure that a later read may not meet (the server unreachable for a while),
    as opposed to a store that is gone."""
    return err.retryable and not isinstance(err, StoreLost)


class CommitWatcher:
    """Calls back whoever is :meth:`watching` when the store's commit counter changes;
    reads it every ``tick_s`` (or the shortest tick a current watcher asked for, never
    below the store's ``floor_s``) while anyone watches, not at all otherwise (its
    thread ends after a second with no one watching)."""

    def __init__(
        self,
        counter: Callable[[], int],
        tick_s: float = TICK_S,
        floor_s: float = 0.0,
        waiter: Callable[[float], None] | None = None,
        signalled: Callable[[], bool] | None = None,
    ) -> None:
        # Weakly: the watcher (kept per store in a weak mapping) must not keep it alive.
        self._counter: Callable[[], Callable[[], int] | None] = _weakly(counter)
        # The store's wait for a commit notification (kv.commit_waiter_of), else a sleep:
        # between reads, the watcher waits a tick or until a commit is notified.
        self._waiter: Callable[[], Callable[[float], None] | None] | None = (
            None if waiter is None else _weakly(waiter)
        )
        # Whether the waiter returns on commits (not only at its timeout): the store's say.
        self._signalled = signalled
        self.tick_s = max(tick_s, floor_s)
        # The store's own shortest tick (a round trip per read): no watcher polls faster.
        self.floor_s = floor_s
        self._cond = threading.Condition()
        # (callback, tick) of each current watcher: equal entries are interchangeable.
        self._callbacks: list[tuple[Callable[[], None], float]] = []
        self._last: int | None = None  # the counter when last read while watched
        self._thread: threading.Thread | None = None
        self._failed = False
        # The last value read and when (time.monotonic()), by any caller.
        self._fresh: tuple[int, float] | None = None
        # Reads that failed for a while: logged once per interval, and the number of
        # times reading resumed after such a streak (the waiters were called back).
        self.failures = RepeatedFailure(
            log,
            "commit watcher reads",
            level=logging.WARNING,
            failing="the commit watcher cannot read the store's commit counter",
            recovered="the commit watcher reads the store's commit counter again",
        )
        self.resumed = 0
        self._missed = False  # a read failed since the last one that worked

    @property
    def alive(self) -> bool:
        """False once reading the counter failed (the store was closed): callers fall
        back to their own periodic scans."""
        return not self._failed

    @property
    def signalled(self) -> bool:
        """Whether the store signals commits (its waiter returns on one), so a watcher
        may tick slowly and still hear of a commit at once. False once reading failed."""
        if self._failed or self._waiter is None or self._waiter() is None:
            return False
        return self._signalled is None or self._signalled()

    def _read(self) -> int:
        counter = self._counter()
        if counter is None:
            raise StorageError("the store is gone")
        value = counter()
        self._fresh = (value, time.monotonic())
        return value

    def version(self) -> int | None:
        """The counter now (None once the watcher failed): pass it to :meth:`watching`
        as ``since`` to hear of commits made from now on. While reads fail for a while,
        the last value read (a stale one calls the next :meth:`watching` back at once: a
        rescan to spare), or None if none was.

        Where each read is a round trip (a store's ``floor_s``), a value read less than
        that long ago is reused: the scan a wake-up starts asks nothing more. A commit
        made since that read then calls the next :meth:`watching` back at once: a rescan
        to spare, never a commit missed."""
        if self._failed:
            return None
        fresh = self._fresh
        if fresh is not None and time.monotonic() - fresh[1] < self.floor_s:
            return fresh[0]
        try:
            return self._read()
        except StorageError as err:
            if _transient(err):
                self._missed = True
                return None if fresh is None else fresh[0]
            self._failed = True
            return None

    @contextmanager
    def watching(
        self,
        callback: Callable[[], None],
        since: int | None = None,
        *,
        tick_s: float | None = None,
    ) -> Iterator[None]:
        """While inside, ``callback()`` runs (on the watcher's thread, so it must only
        signal) after each commit to the store made from now on, within a tick or so; with
        ``since`` (a :meth:`version`), at once if there was a commit since then. ``tick_s``:
        this watcher's tick, when not the watcher's own."""
        tick = self.tick_s if tick_s is None else tick_s
        if not tick > 0:
            raise ValueError(f"tick_s must be positive, not {tick_s!r}")
        with self._cond:
            watched = not self._failed
            current: int | None = None
            if watched:
                # Read now, so a commit made after this returns is seen even if the
                # thread has not run yet.
                try:
                    current = self._read()
                except StorageError as err:
                    if _transient(err):
                        self._missed = True  # called back once a read works again
                    else:
                        self._failed, watched = True, False
            if watched:
                if not self._callbacks:
                    self._last = current
                if current is not None and since is not None and current != since:
                    callback()
                entry = (callback, tick)
                self._callbacks.append(entry)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="quick-commit-watcher", daemon=True
                    )
                    self._thread.start()
                self._cond.notify_all()
        try:
            yield
        finally:
            if watched:
                with self._cond:
                    self._callbacks.remove(entry)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._callbacks:
                    self._cond.wait(1.0)
                    if not self._callbacks:
                        self._thread = None  # the next watching() starts another
                        return
                callbacks = [callback for callback, _ in self._callbacks]
                tick = max(self.floor_s, min(tick for _, tick in self._callbacks))
                last = self._last
            try:
                version = self._read()
            except StorageError as err:
                if _transient(err):
                    self._missed = True
                    failures = self.failures.failed(err)
                    with self._cond:  # a new watcher ends the wait early
                        self._cond.wait(backoff(failures, base_s=0.05, cap_s=RETRY_CAP_S))
                    continue
                log.debug("commit watcher stops: %s", err)
                with self._cond:
                    self._failed = True
                    self._thread = None
                    callbacks = [callback for callback, _ in self._callbacks]
                for callback in callbacks:
                    callback()  # waiters rescan, and from then on poll at their period
                return
            self.failures.succeeded()
            with self._cond:
                if self._callbacks:
                    self._last = version
                missed, self._missed = self._missed, False
            if missed:
                self.resumed += 1
            if missed or (last is not None and version != last):
                # After failed reads, a commit made meanwhile may have gone unseen: the
                # waiters rescan.
                for callback in callbacks:
                    callback()
            self._wait(tick)

    def _wait(self, tick: float) -> None:
        """A tick, or less: until a commit is notified (never less than MIN_READ_GAP_S
        from this read to the next, however many are)."""
        waiter = None if self._waiter is None else self._waiter()
        if waiter is None:
            time.sleep(tick)
            return
        began = time.monotonic()
        waiter(tick)
        rest = MIN_READ_GAP_S - (time.monotonic() - began)
        if rest > 0:
            time.sleep(rest)


def _weakly(method: Callable[..., Any]) -> Callable[[], Callable[..., Any] | None]:
    """A bound method held weakly (a store's), anything else as it is."""
    if inspect.ismethod(method):
        return weakref.WeakMethod(method)
    return lambda: method


_watchers: weakref.WeakKeyDictionary[object, CommitWatcher] = weakref.WeakKeyDictionary()
_watchers_lock = threading.Lock()


def watcher_for(kv: object) -> CommitWatcher | None:
    """The one :class:`CommitWatcher` of ``kv`` in this process, or None when the store
    lacks the :class:`~quickzones.store.kv.CommitCounter` capability."""
    counter = commit_counter_of(kv)
    if counter is None:
        return None
    with _watchers_lock:
        watcher = _watchers.get(kv)
        if watcher is None or not watcher.alive:
            floor = commit_counter_tick_of(kv)
            watcher = _watchers[kv] = CommitWatcher(
                counter, floor_s=floor, waiter=commit_waiter_of(kv), signalled=_signalled(kv)
            )
        return watcher


def _signalled(kv: object) -> Callable[[], bool]:
    """Whether ``kv`` signals commits now: its ``commits_signalled`` (SQLite: a file
    signal could be opened; PostgreSQL: a listening connection hears NOTIFYs, not behind
    PgBouncer's transaction pooling), True where it has a waiter and no such flag."""
    ref = weakref.ref(kv)

    def signalled() -> bool:
        store = ref()
        return store is not None and getattr(store, "commits_signalled", True) is True

    return signalled


def watchers_for(kvs: Iterable[object]) -> list[CommitWatcher]:
    """One :class:`CommitWatcher` per distinct store of ``kvs`` that has one (a consumer
    of several clusters watches each of their stores once)."""
    watchers: list[CommitWatcher] = []
    for kv in kvs:
        watcher = watcher_for(kv)
        if watcher is not None and watcher not in watchers:
            watchers.append(watcher)
    return watchers

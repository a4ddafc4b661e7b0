"""Long polls: a pull consumer's request that waits up to ``wait_s`` for its first item
(as SQS's ReceiveMessage does), rescanning when something may have changed.

A poll scans (its ``scan``: :meth:`~quickzones.consumer.pull_leaser.PullLeaser.scan_for`);
with nothing leased and time left it waits, and scans again when an enqueue through the
server's own :class:`~quickzones.client.Quick` wakes it (:meth:`LongPolls.wake`), when the
store tells of commits from other processes (:mod:`quickzones.store.changes`: SQLite), and
at the latest every ``poll_s`` (doubling up to ``poll_max_s``). A scan that leased zones'
pointers and got no item from them (their items are of job types it refuses, or another
consumer was faster) made commits that wake the waiting polls of other servers on the
same file, as theirs wake it (a store's own commits wake nobody): after each such scan,
store changes count only once a wait doubling from 1 ms up to ``poll_s`` has passed since
it, so waiting polls cannot keep each other scanning. A poll that leases nothing waits for
a change again.

:meth:`LongPolls.wait` waits on the calling thread; :meth:`LongPolls.wait_async` is the
same poll holding no thread while it waits (the server's: each scan runs on a worker
thread, a few short transactions).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from quickzones.store.changes import CommitWatcher

R = TypeVar("R")  # what a poll asks for
T = TypeVar("T")  # what a scan gives


class Poll(Generic[R]):
    """One long poll: what it asks for, and its schedule of scans."""

    def __init__(
        self,
        request: R,
        wait_s: float,
        poll_s: float,
        watcher: CommitWatcher | None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.request = request
        self.stopping = stopping
        self.deadline = time.monotonic() + wait_s
        self.pause = poll_s  # the longest wait to the next scan (doubling)
        self.gap = 0.0  # how long after a scan store changes do not yet count
        self.watcher = watcher if wait_s > 0 else None


@dataclass(frozen=True, slots=True)
class _Wait:
    """Between two scans of a poll: the wake-up counters at its scan, from when store
    changes count, until when at most, and the commit watch to leave when it ends."""

    seen: tuple[int, int]
    changes_count_from: float
    until: float
    watch: contextlib.ExitStack


class LongPolls(Generic[R, T]):
    """The waits of one server's long polls, and what wakes them."""

    def __init__(
        self,
        scan: Callable[[R], tuple[list[T], int]],
        watcher: CommitWatcher | None,
        poll_max_s: float,
    ) -> None:
        # One scan for a poll's request: what it got, and how many zones' pointers it
        # leased (and released) for that.
        self.scan = scan
        self.watcher = watcher  # commits by other processes, where the store tells
        self.poll_max_s = poll_max_s
        self._cond = threading.Condition()
        self._generation = 0  # wakes (an enqueue through this server)
        self._changes = 0  # commits by other processes seen
        # The waits of wait_async: their loops and events, woken with the Condition.
        self._async_waits: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def wake(self) -> None:
        """Every waiting poll scans again now (a local enqueue)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            self._wake_async()

    def wait(self, poll: Poll[R]) -> list[T]:
        """Scan, and wait and scan again, until the scan gives something or the poll's
        time is up."""
        while True:
            step = self._step(poll)
            if isinstance(step, list):
                return step
            with step.watch, self._cond:
                while (timeout := self._due(step)) is not None:
                    self._cond.wait(timeout)

    async def wait_async(
        self,
        poll: Poll[R],
        to_thread: Callable[[Callable[[], list[T] | _Wait]], Awaitable[list[T] | _Wait]],
    ) -> list[T]:
        """:meth:`wait` for an event loop; ``to_thread`` runs each scan on a worker thread
        (the server's: anyio's, bounded)."""
        while True:
            step = await to_thread(functools.partial(self._step, poll))
            if isinstance(step, list):
                return step
            with step.watch:
                await self._wait_async(step)

    def _step(self, poll: Poll[R]) -> list[T] | _Wait:
        """One scan of a long poll: the items to answer with, or (nothing leased and time
        left) what to wait for before the next scan, the store's commits watched from
        before the scan on."""
        seen = (self._generation, self._changes)
        # Commits from here on count; the watcher is only asked to watch (a thread
        # reading the counter every millisecond) while this poll waits.
        watcher = poll.watcher
        version = None if watcher is None else watcher.version()
        scanned = time.monotonic()
        got, visited = self.scan(poll.request)
        now = time.monotonic()
        if got or now >= poll.deadline or (poll.stopping is not None and poll.stopping.is_set()):
            return got
        if visited:
            poll.gap = min(max(poll.gap * 2, 0.001), poll.pause)
        watch = contextlib.ExitStack()
        if watcher is not None and version is not None:
            watch.enter_context(watcher.watching(self._store_changed, since=version))
        wait = _Wait(seen, scanned + poll.gap, min(scanned + poll.pause, poll.deadline), watch)
        poll.pause = min(poll.pause * 2, self.poll_max_s)
        return wait

    def _store_changed(self) -> None:
        with self._cond:
            self._changes += 1
            self._cond.notify_all()
            self._wake_async()

    def _wake_async(self) -> None:
        """Wake the waits of :meth:`wait_async` (called holding ``_cond``)."""
        for loop, event in self._async_waits:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _due(self, wait: _Wait) -> float | None:
        """None once ``wait`` is over (a local enqueue, a store change seen after its
        ``changes_count_from``, or its ``until``); else how long at most to wait before
        asking again. Called holding ``_cond``."""
        if self._generation != wait.seen[0]:
            return None
        now = time.monotonic()
        if now >= wait.until:
            return None
        timeout = wait.until - now
        if self._changes != wait.seen[1]:
            if now >= wait.changes_count_from:
                return None
            timeout = min(timeout, wait.changes_count_from - now)
        return timeout

    async def _wait_async(self, wait: _Wait) -> None:
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._cond:
            self._async_waits.add(waiter)
        try:
            while True:
                event.clear()  # before _due: a wake from here on sets it again
                with self._cond:
                    timeout = self._due(wait)
                if timeout is None:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._cond:
                self._async_waits.discard(waiter)

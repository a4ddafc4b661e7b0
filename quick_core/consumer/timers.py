"""Exact timers: items a Manager leased ahead of their vesting time (the consumer's
``timer_lookahead_s``) wait here and go to the workers at that time, never before.

The visit that took such an item (its pointer lease, dequeue and requeue commits) ran
while the item was not yet due, so the item's lateness is this thread's wake-up and the
hand-off to a worker, not the store's commits: the in-worker timers of Celery's ETA tasks,
with the item's lease held in the store the whole time (from its vesting time on), so a
crash gives it back when that lease ends, as for any leased item. Such a lease is *held*
(``WorkItem.held``): its run is counted by the worker's start check at its due time, so a
crash before then counts nothing against it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

from quickzones.clock import Clock
from quickzones.consumer.state import Work

# Longest single wait: a clock that is not the wall clock (a test's manual clock) is
# re-read at least this often.
_MAX_WAIT_S = 0.1


class DueTimers:
    """Works with a ``due_ms``, in due order, handed to ``post`` when due."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[int, int, Work]] = []
        self._order = itertools.count()  # ties in due time keep their hand-out order
        self._changed = threading.Condition()

    def __len__(self) -> int:
        with self._changed:
            return len(self._heap)

    def add(self, work: Work) -> None:
        """Hold ``work`` until its ``due_ms``."""
        assert work.due_ms is not None
        with self._changed:
            heapq.heappush(self._heap, (work.due_ms, next(self._order), work))
            if self._heap[0][2] is work:
                self._changed.notify()  # an earlier timer than the one waited for

    def wake(self) -> None:
        """End the current wait (a stop)."""
        with self._changed:
            self._changed.notify_all()

    def due(self) -> list[Work]:
        """Take every work whose time has come (by this consumer's clock)."""
        now = self.clock.now() * 1000
        out: list[Work] = []
        with self._changed:
            while self._heap and self._heap[0][0] <= now:
                out.append(heapq.heappop(self._heap)[2])
        return out

    def run(self, post: Callable[[Work], None], stopping: threading.Event) -> None:
        """Hand each work to ``post`` at its due time, until ``stopping``."""
        while not stopping.is_set():
            with self._changed:
                if not self._heap:
                    # add() and wake() notify; no clock read either (a steady clock's
                    # read may cost a store exchange): an idle consumer costs nothing.
                    self._changed.wait(1.0)
                    continue
            for work in self.due():
                post(work)
            with self._changed:
                if stopping.is_set():
                    return
                if not self._heap:
                    continue
                wait = (self._heap[0][0] - self.clock.now() * 1000) / 1000
                if wait > 0:
                    self._changed.wait(min(wait, _MAX_WAIT_S))

    def drain(self) -> list[Work]:
        """Take every held work, due or not (a stop gives them back)."""
        with self._changed:
            out = [work for _, _, work in sorted(self._heap)]
            self._heap.clear()
        return out

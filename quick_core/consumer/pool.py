"""A small pool of daemon threads, whose queued tasks are served fairly across lanes.

The standard ThreadPoolExecutor joins its threads at interpreter exit, so one handler stuck
in a blocking call would keep a stopped worker process alive forever. Daemon threads let
the consumer give back the stuck item's lease at its shutdown deadline and exit.

Tasks posted with a ``lane`` (the consumer's workers use the item's zone) wait in one
queue per lane and threads take from the lanes in turn: a zone whose visit brought many
items into the local queue cannot make a small tenant's item, leased just after, wait
behind all of them (the paper's water-filling fairness, kept inside one consumer).
Within a lane, tasks run in the order posted. A lane posted with a weight (a tenant's,
:mod:`quickzones.consumer.weighing`) takes that many turns to a weight-1 lane's (deficit
round robin), so a weighted tenant's share holds inside the consumer too.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_STOP = object()
_STOP_LANE = object()  # served only once every other lane is empty


class Empty(Exception):
    """No task is queued (:meth:`FairQueue.get_nowait`)."""


class FairQueue:
    """A FIFO queue per lane; :meth:`get` takes from the lanes round-robin."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lanes: OrderedDict[Hashable, deque[Any]] = OrderedDict()
        # Lanes of a weight other than 1, and the turns each has banked (deficit round
        # robin); both empty while no lane is weighted: plain round robin.
        self._weights: dict[Hashable, float] = {}
        self._deficits: dict[Hashable, float] = {}

    def put(self, task: Any, lane: Hashable = None, weight: float = 1.0) -> None:
        self.put_many((task,), lane, weight)

    def put_many(self, tasks: Sequence[Any], lane: Hashable = None, weight: float = 1.0) -> None:
        """Queue ``tasks`` at the back of ``lane``, in order, under one lock, and wake as
        many waiting threads as there are tasks: a visit's batch costs one wake-up per
        idle thread, not one per item (a thread awake takes the next task unwoken)."""
        if not tasks:
            return
        with self._cond:
            queued = self._lanes.get(lane)
            if queued is None:
                queued = self._lanes[lane] = deque()
            queued.extend(tasks)
            if weight != 1.0:
                self._weights[lane] = weight
            elif self._weights:
                self._weights.pop(lane, None)
            self._cond.notify(len(tasks))

    def get(self) -> Any:
        with self._cond:
            while not self._lanes:
                self._cond.wait()
            return self._take()

    def get_nowait(self) -> Any:
        with self._cond:
            if not self._lanes:
                raise Empty
            return self._take()

    def _take(self) -> Any:
        if self._weights:
            return self._take_weighted()
        lanes = self._lanes
        lane = next(iter(lanes))
        if lane is _STOP_LANE and len(lanes) > 1:
            lanes.move_to_end(lane)  # let queued work run first
            lane = next(iter(lanes))
        queued = lanes.pop(lane)
        task = queued.popleft()
        if queued:
            lanes[lane] = queued  # to the back: the next lane goes first
        return task

    def _take_weighted(self) -> Any:
        """Deficit round robin: the lane in front banks its weight in turns and runs
        while it has a whole one; a lane alone runs at once."""
        lanes, weights, deficits = self._lanes, self._weights, self._deficits
        while True:
            lane = next(iter(lanes))
            if lane is _STOP_LANE and len(lanes) > 1:
                lanes.move_to_end(lane)
                continue
            banked = deficits.get(lane, 0.0)
            if banked < 1.0:
                banked += weights.get(lane, 1.0)
                if banked < 1.0 and len(lanes) > 1:
                    deficits[lane] = banked
                    lanes.move_to_end(lane)
                    continue
            queued = lanes[lane]
            task = queued.popleft()
            banked -= 1.0
            if not queued:
                del lanes[lane]
                deficits.pop(lane, None)  # an emptied lane banks nothing
                weights.pop(lane, None)
            elif banked >= 1.0:
                deficits[lane] = banked  # more turns: stays in front
            else:
                deficits[lane] = max(0.0, banked)
                lanes.move_to_end(lane)
            return task


def in_turn(tasks: Iterable[T], lane: Callable[[T], Hashable]) -> Iterator[T]:
    """``tasks`` in the order a :class:`FairQueue` serves them: the lanes in turn, each in
    the order given (a thread that runs a round's work itself, as the pool would)."""
    queue = FairQueue()
    for task in tasks:
        queue.put(task, lane(task))
    while True:
        try:
            yield queue.get_nowait()
        except Empty:
            return


class DaemonPool:
    """``submit`` returns a Future; ``shutdown`` waits at most until a deadline."""

    def __init__(self, size: int, name: str) -> None:
        self._queue = FairQueue()
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        while True:
            try:
                task = self._queue.get()
            except BaseException:
                # A stray asynchronous exception (an interrupt meant for a handler that
                # already returned): a worker thread must survive anything.
                continue
            if task is _STOP:
                return
            try:
                self._run(task)
            except BaseException:
                continue  # as above: never let the thread die

    @staticmethod
    def _run(task: Any) -> None:
        future, fn, args = task
        if future is None:  # post(): nobody waits for the result
            try:
                fn(*args)
            except BaseException:  # posted tasks handle and log their own errors
                pass
            return
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # handed to whoever waits on the future
            future.set_exception(err)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def post(
        self, fn: Callable[..., Any], *args: Any, lane: Hashable = None, weight: float = 1.0
    ) -> None:
        """Run ``fn(*args)`` on the pool without a Future. Queued tasks of different
        lanes are taken in turn, ``weight`` turns for this lane to one of a weight-1 lane."""
        self.post_many(fn, (args,), lane=lane, weight=weight)

    def post_many(
        self,
        fn: Callable[..., Any],
        args: Iterable[tuple[Any, ...]],
        *,
        lane: Hashable = None,
        weight: float = 1.0,
    ) -> None:
        """:meth:`post` ``fn(*a)`` for each ``a`` of ``args``, queued in that order in one
        call: the hand-off of a Manager's batch to the workers, one lock and one wake-up
        per idle thread for the whole batch, not one per item."""
        self._queue.put_many([(None, fn, a) for a in args], lane, weight)

    def drain(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Take back the posted tasks no thread has started yet, as (fn, args)."""
        taken: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        keep: list[Any] = []
        while True:
            try:
                task = self._queue.get_nowait()
            except Empty:
                break
            if task is not _STOP and task[0] is None:
                taken.append((task[1], task[2]))
            else:
                keep.append(task)
        for task in keep:
            self._queue.put(task, _STOP_LANE if task is _STOP else None)
        return taken

    def shutdown(self, deadline: float) -> bool:
        """Let queued tasks run, then stop; True if every thread ended by ``deadline``
        (a ``time.monotonic()`` value)."""
        for _ in self._threads:
            self._queue.put(_STOP, _STOP_LANE)
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

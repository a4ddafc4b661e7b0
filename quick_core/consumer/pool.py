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
        self._lock = threading.Lock()
        # Idle threads park each on a locked Lock of its own, the last parked on top of
        # ``_parked``. At most one is woken at a time (moved to ``_woken``), outside
        # ``_lock``; the thread that takes a task hands the wake on while tasks remain
        # (:meth:`_pass_on`). A shared Condition's notify(n) made the thread that posts a
        # visit's items (a manager, between its dequeue and its requeue commit) pay every
        # wake-up, each woken thread then blocking at once on the lock it still held: a
        # quarter of the demo's GIL samples in one profile, 13 % in another, were that
        # Condition.notify (issue 40 point 9).
        self._parked: list[threading.Lock] = []
        self._woken: set[threading.Lock] = set()
        self._lanes: OrderedDict[Hashable, deque[Any]] = OrderedDict()
        # Lanes of a weight other than 1, and the turns each has banked (deficit round
        # robin); both empty while no lane is weighted: plain round robin.
        self._weights: dict[Hashable, float] = {}
        self._deficits: dict[Hashable, float] = {}

    def put(self, task: Any, lane: Hashable = None, weight: float = 1.0) -> None:
        self.put_many((task,), lane, weight)

    def put_many(self, tasks: Sequence[Any], lane: Hashable = None, weight: float = 1.0) -> None:
        """Queue ``tasks`` at the back of ``lane``, in order, under one lock, and wake one
        parked thread unless one is already on its way: a batch costs its poster one
        wake-up at most, and every idle thread still wakes while tasks remain (each
        thread that takes one wakes the next, :meth:`_pass_on`)."""
        if not tasks:
            return
        wake = None
        try:
            with self._lock:
                queued = self._lanes.get(lane)
                if queued is None:
                    queued = self._lanes[lane] = deque()
                queued.extend(tasks)
                if weight != 1.0:
                    self._weights[lane] = weight
                elif self._weights:
                    self._weights.pop(lane, None)
                wake = self._pass_on()
        finally:
            if wake is not None:
                wake.release()

    def _pass_on(self) -> threading.Lock | None:
        """Under ``_lock``: the parked thread to wake now (the caller releases its lock
        once out of ``_lock``), when tasks are queued and no woken thread is yet to take
        one; the most recently parked first, its stack the warmest."""
        if self._lanes and self._parked and not self._woken:
            waiter = self._parked.pop()
            self._woken.add(waiter)
            return waiter
        return None

    def get(self) -> Any:
        """The next task; parks the calling thread until one is queued."""
        waiter: threading.Lock | None = None  # this thread's, while parked or woken
        wake = None
        try:
            while True:
                with self._lock:
                    if waiter is not None:
                        self._woken.discard(waiter)
                        waiter = None
                    if self._lanes:
                        task = self._take()
                        wake = self._pass_on()  # tasks left: the next idle thread
                        return task
                    waiter = threading.Lock()
                    waiter.acquire()
                    self._parked.append(waiter)
                waiter.acquire()  # released by the put or take that woke this thread
        except BaseException:
            # An asynchronous exception (an interrupt meant for a handler that already
            # returned) while parked or just woken: never leave a lock that no thread
            # waits on in the stacks, nor swallow a wake-up a queued task needs.
            if waiter is not None:
                self._leave(waiter)
            raise
        finally:
            if wake is not None:
                wake.release()

    def _leave(self, waiter: threading.Lock) -> None:
        wake = None
        try:
            with self._lock:
                if waiter in self._parked:
                    self._parked.remove(waiter)
                self._woken.discard(waiter)
                wake = self._pass_on()
        finally:
            if wake is not None:
                wake.release()

    def get_nowait(self) -> Any:
        with self._lock:
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

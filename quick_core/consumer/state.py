"""What the parts of a consumer share: the clusters it polls, the unit of work a Manager
(Algorithm 2) hands to a Worker (Algorithm 3), and the in-flight bookkeeping under one
lock: counts that bound a scan (``processing_bound``), the room each visit in progress has
claimed, per-type reservations, the items held and not started yet (whose leases the lease
extender keeps), and the handler invocations running now, which it may interrupt.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from quickzones.consumer.flag import Flag
from quickzones.consumer.interrupt import (
    HandlerInterrupted,
    clear_pending_interrupt,
    interrupt_thread,
)
from quickzones.store.heartbeats import RunningItem
from quickzones.store.kv import KVStore
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.zonestore import ZoneStore

# An item started within this long of its dequeue needs no read before it starts: a cancel
# can hardly land in between, and one that does reaches the running handler
# (ctx.cancelled) within half a second. Reading every item again before it starts cost a
# third of a no-op consumer's throughput (bench.lone_tenant, quick worker --workers 4).
START_CHECK_AFTER_S = 0.05


@dataclass(frozen=True, slots=True)
class Cluster:
    """One store a consumer polls: its zones and its top-level queue (paper: a cluster)."""

    zones: ZoneStore
    toplevel: TopLevelQueue
    kv: KVStore | None = None
    # The consumer's name, recorded with each pointer lease its visits take.
    holder: str | None = None

    @property
    def name(self) -> str:
        return self.toplevel.cluster


@dataclass(slots=True)
class Work:
    """One leased item handed from a Manager to a Worker."""

    zone: ZoneId
    item: WorkItem
    dequeued_at: float
    app_slot: bool = False  # holds one of its app's pool-wide concurrency slots
    # The per-tenant slots it holds (consumer.tenant_admission), released when it ends.
    tenant_slots: tuple[tuple[str, ...], ...] = ()
    cluster: str = "default"
    # At-most-once: the item was deleted because its handler started; nothing is left to
    # give back or requeue.
    started: bool = False
    result: Any = None  # the handler's return value, kept if its type asks (outcomes.py)
    # Leased ahead of its vesting time (timer lookahead): not to start before this (store
    # ms); None for an item leased once vested.
    due_ms: int | None = None
    # The pointer it was dequeued through (cluster, shard, pointer id): the consumer's
    # count of items in flight per zone, by which a scan orders the zones it visits.
    pointer_key: tuple[str, int, str] | None = None
    # Set when the item was found cancelled while its handler ran: the handler sees it
    # (``ctx.cancelled``, cooperative) and the worker completes nothing.
    cancelled: Flag = field(default_factory=Flag)
    # What its handler left for a retry (JobContext.retry_meta), merged by the requeue.
    retry_meta: dict[str, Any] = field(default_factory=dict)
    # Handed out while a worker was idle, so it starts as it is dequeued: the dequeue's
    # read of the item is its start check (Algorithm 3), and the worker makes no other.
    direct: bool = False
    # time.monotonic() until which its dequeue still counts as its start check (set by
    # mark_direct; None: always checked). An item that waited longer for a worker or a
    # timer is read again before it starts.
    fresh_until: float | None = None


@dataclass(slots=True)
class Running:
    """One handler invocation in progress."""

    work: Work
    thread_id: int
    started: float
    deadline: float | None
    lease_lost: Flag = field(default_factory=Flag)
    interrupted: bool = False
    transactional: bool = False  # its lease is extended by its worker, between attempts
    # Set (under the consumer's lock) when this invocation ends: from then on no interrupt
    # is sent for it, so none can land in whatever the thread runs next.
    done: bool = False


@dataclass(slots=True)
class _Claim:
    """The room one visit in progress (on one manager thread) may fill."""

    room: int
    taken: int = 0

    @property
    def left(self) -> int:
        return max(0, self.room - self.taken)


class InFlight:
    """Items handed out and not finished, per consumer, under one lock.

    ``processing_bound`` caps :attr:`count`, the items this consumer holds: leased and
    waiting for a worker or a timer, or running. Managers visit concurrently and each
    reads :meth:`capacity` before its dequeue and counts what it took after it, so each
    visit first claims its room (:meth:`claim`): inside a claim :meth:`capacity` is what
    is left of this thread's claim, and the others' unfilled claims are not free to
    anyone else. Together the visits never take more than the bound."""

    def __init__(
        self,
        processing_bound: int,
        freed: Callable[[], None] = lambda: None,
        *,
        workers: int = 0,
    ) -> None:
        self.processing_bound = processing_bound
        # Items handed out while this many workers were idle start at once: their dequeue
        # is their start check (see Work.direct).
        self.workers = workers
        # Told when room frees up (an item finished, a claim ended): the scanner waits
        # for it when the consumer is full (Algorithm 1: scan when a worker is free).
        self.freed = freed
        self.lock = threading.Lock()
        self.count = 0
        self.per_type: Counter[str] = Counter()
        self.running: dict[int, Running] = {}
        self.unknown_types: set[str] = set()
        self.per_pointer: Counter[tuple[str, int, str]] = Counter()
        self._claims: dict[int, _Claim] = {}
        # Items handed out whose handler has not started (by id(work)): their leases are
        # kept by the lease extender, so waiting for a worker never lets one lapse.
        self._waiting: dict[int, Work] = {}

    def _free(self, excluding: int | None) -> int:
        """The bound less what is held and what other visits claimed (under the lock)."""
        claimed = sum(c.left for t, c in self._claims.items() if t != excluding)
        return max(0, self.processing_bound - self.count - claimed)

    def capacity(self) -> int:
        """How many more items this consumer may take: within a visit's :meth:`claim`,
        what is left of it; elsewhere, the room no visit has claimed."""
        me = threading.get_ident()
        with self.lock:
            claim = self._claims.get(me)
            if claim is None:
                return self._free(None)
            return min(claim.left, self._free(me))

    @contextmanager
    def claim(self, wanted: int) -> Iterator[int]:
        """Claim up to ``wanted`` of the free room for the visit this thread makes now;
        yields the room claimed (0: none free). What the visit did not fill is free
        again when it ends."""
        me = threading.get_ident()
        with self.lock:
            self._claims[me] = claim = _Claim(min(max(0, wanted), self._free(None)))
        try:
            yield claim.room
        finally:
            with self.lock:
                self._claims.pop(me, None)
            if claim.left:
                self.freed()

    def taking(self, items: int) -> None:
        """The visit this thread makes will hand out at most ``items`` more (its
        transaction read them and commits next): what its claim holds beyond them is
        free again at once."""
        with self.lock:
            claim = self._claims.get(threading.get_ident())
            if claim is None or claim.left <= items:
                return
            claim.room = claim.taken + items
        self.freed()

    def startable(self) -> int:
        """Workers free to start an item now, less what other visits in progress claimed:
        how many items this thread's visit may lease to start at once (their runs counted
        at the grant). What it takes beyond them waits, leased held (``WorkItem.held``),
        its run counted when it starts."""
        me = threading.get_ident()
        with self.lock:
            others = sum(c.left for t, c in self._claims.items() if t != me)
            return max(0, self.workers - self.count - others)

    def total(self) -> int:
        with self.lock:
            return self.count

    def snapshot(self) -> list[Running]:
        with self.lock:
            return list(self.running.values())

    def running_items(self) -> list[RunningItem]:
        """The handler invocations running now, as a heartbeat record lists them."""
        return [
            RunningItem(
                r.work.zone, r.work.item.item_id, r.work.item.job_type, r.work.item.attempts,
                int(r.started * 1000), r.work.item.vesting_ms,
            )
            for r in self.snapshot()
        ]  # fmt: skip

    def finished(self, work: Work) -> None:
        with self.lock:
            self._waiting.pop(id(work), None)
            self.count -= 1
            self.per_type[work.item.job_type] -= 1
            key = work.pointer_key
            if key is not None:
                left = self.per_pointer[key] - 1
                if left > 0:
                    self.per_pointer[key] = left
                else:
                    self.per_pointer.pop(key, None)
        self.freed()

    def handed_out(self, works: list[Work]) -> None:
        """Count ``works`` (already in :attr:`count`) against the pointers they came
        through and against this thread's claim, and hold their leases until they start."""
        with self.lock:
            claim = self._claims.get(threading.get_ident())
            if claim is not None:
                claim.taken += len(works)
            for work in works:
                self._waiting[id(work)] = work
                if work.pointer_key is not None:
                    self.per_pointer[work.pointer_key] += 1

    def cancel_held(self, zone: ZoneId, item_id: str) -> None:
        """Set the cancel event of the held item ``item_id`` of ``zone`` (waiting or
        running), if this consumer holds it."""
        with self.lock:
            held = [*self._waiting.values(), *(r.work for r in self.running.values())]
        for work in held:
            if work.item.item_id == item_id and work.zone == zone:
                work.cancelled.set()

    def mark_direct(self, works: list[Work]) -> None:
        """Mark the ``works`` just handed out that go to an idle worker at once (not to a
        timer): their dequeue is their start check (:attr:`Work.direct`). Every held item
        has a worker or waits for one, so the workers left idle for these are the workers
        less what was held before them. Only a consumer whose workers take items as they
        are handed out calls this (not ``run_until_idle``'s one-at-a-time driving)."""
        fresh_until = time.monotonic() + START_CHECK_AFTER_S
        with self.lock:
            idle = self.workers - (self.count - len(works))
            for work in works:
                if work.due_ms is not None:
                    continue  # waits for its timer: checked before it starts
                work.fresh_until = fresh_until
                if idle > 0:
                    work.direct = True
                    idle -= 1

    def hold(self, works: list[Work]) -> None:
        """Count ``works``, leased by something other than a Manager's visit (a remote
        worker's pull lease), as held; :meth:`finished` releases each."""
        with self.lock:
            self.count += len(works)
            for work in works:
                self.per_type[work.item.job_type] += 1
        self.handed_out(works)

    def waiting(self) -> list[Work]:
        """Items held and not started: waiting for a worker or for their timer."""
        with self.lock:
            return list(self._waiting.values())

    def renewed(self, work: Work, item: WorkItem) -> None:
        """Keep the renewed ``item`` of ``work`` if it still waits: once its worker
        started it, the worker's own copy (from its start check) is newer."""
        with self.lock:
            if id(work) in self._waiting:
                work.item = item

    def starting(self, work: Work) -> None:
        """``work``'s worker takes over its lease (its start check is next)."""
        with self.lock:
            self._waiting.pop(id(work), None)

    def of_pointer(self, cluster: str, shard: int, pointer_id: str) -> int:
        """Items in flight that were dequeued through this pointer."""
        with self.lock:
            return self.per_pointer.get((cluster, shard, pointer_id), 0)

    def begin(self, running: Running) -> None:
        with self.lock:
            self.running[running.thread_id] = running

    def end(self, running: Running) -> None:
        """Unregister a handler invocation so that no interrupt is sent for it any more,
        and drop one sent but not landed yet. One that lands here, after the handler
        ended, is spent and ignored: the completion re-checks the lease anyway."""
        while True:
            try:
                with self.lock:
                    running.done = True
                    if self.running.get(running.thread_id) is running:
                        del self.running[running.thread_id]
                if running.interrupted:
                    clear_pending_interrupt()
                return
            except HandlerInterrupted:
                continue

    def interrupt(self, running: Running, exc: type[HandlerInterrupted]) -> None:
        """Interrupt exactly this invocation: sent under the lock its end takes, so never
        after it ended (and so never into the next item's handler on that thread)."""
        with self.lock:
            if running.done or self.running.get(running.thread_id) is not running:
                return
            running.interrupted = interrupt_thread(running.thread_id, exc)

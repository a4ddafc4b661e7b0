"""Leases for pull consumers: paper Algorithms 1 and 2 run on behalf of remote workers,
through the consumer's own selection and visit code.

One :meth:`PullLeaser.lease` call scans the vested pointers of every shard (filtered to
the caller's app) and chooses among them as a scanner does
(:class:`~quickzones.consumer.selection.Selection`: a random ``selection_frac`` of each
shard's window of ``peek_max``, at most ``selection_max``; the oldest first with
``in_order=True``), so concurrent pull consumers spread over the zones instead of all
contending for the oldest pointer. Each chosen zone is visited through the consumer's one
:class:`~quickzones.consumer.fetcher.Fetcher`, as a Manager visits it (lease the pointer,
dequeue at most ``dequeue_max`` items, or the work-conserving share (capped by
``visit_max``), requeue or collect the pointer) until the call holds ``max_items`` items,
under the same admission rules as a local consumer's visits: the pauses, the tenant
weights (the scan's weighted draw and each visit's weighted turn), the app's limits, the
per-tenant limits, and the job types' pool-wide caps the caller sends; the concurrency
slots an item takes are kept for its remote worker by :mod:`.held_slots` and given back
through the :class:`~quickzones.consumer.settler.Settler` that applies its outcome. A
scan that took items and left vested pointers unchosen is followed by another. If the
caller gave ``fill_s``, once it holds some items and ``fill_s`` has passed since its first
scan began, it visits no more zones, so they do not wait behind many more visits.

The server's leaser is configured by a :class:`~quickzones.consumer.config.ConsumerConfig`
(the scanner's and visit's parameters, the same fields as a local consumer's; its worker,
routing and timer fields do not apply) and a :class:`PullConfig` of what only a server
has: the long poll's waits and how far a scan pages past other apps' pointers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from quickzones.adapters.http.held_slots import HeldSlots
from quickzones.clock import now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.fetcher import TYPE_SCOPE, Fetcher
from quickzones.consumer.maintenance import HEARTBEAT_S
from quickzones.consumer.pickups import PickupCounts
from quickzones.consumer.selection import Selection
from quickzones.consumer.settler import Settler
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_rules import ZoneVisit, visit_size
from quickzones.consumer.weighing import Weighing
from quickzones.errors import CorruptRecord, QuickError, StorageError
from quickzones.store.changes import CommitWatcher, watcher_for
from quickzones.store.keys import LOCAL_APP
from quickzones.store.kv import KVTransaction, run
from quickzones.store.pointer_repair import set_aside
from quickzones.store.records import WorkItem, ZoneId, decode_pointer
from quickzones.store.toplevel import PointerRef

if TYPE_CHECKING:
    from quickzones.client import Quick


@dataclass(frozen=True, slots=True)
class PullConfig:
    """What a server's pull leases have beyond a consumer's parameters."""

    pages_max: int = 5  # windows of peek_max read past other apps' pointers to find the caller's
    # Long poll: the longest wait between empty scans, as a local consumer's idle_sleep_s;
    # an enqueue through this server, or (SQLite) a commit by another process, wakes it.
    poll_s: float = 0.02
    poll_max_s: float = 0.02


_ZONES_REMEMBERED = 100_000  # pointer ids whose zone a leaser keeps (then starts over)


@dataclass(frozen=True, slots=True)
class Leased:
    zone: ZoneId
    item: WorkItem


class PullLeaser:
    """Leases items for remote workers out of one Quick's top-level queue."""

    def __init__(
        self,
        q: Quick,
        config: ConsumerConfig | None = None,
        pull: PullConfig | None = None,
        heartbeat_s: float = HEARTBEAT_S,  # how often pickups are flushed; shorter in tests
        in_order: Callable[[], bool] | None = None,
    ) -> None:
        self.q = q
        self.heartbeat_s = heartbeat_s
        self.config = config or ConsumerConfig()
        self.config.validate()
        self.pull = pull or PullConfig()
        self.rng = random.Random(self.config.seed)
        # Whether a scan takes the oldest pointers first: the server holds its cluster's
        # in-order scanner lease (adapters/http/in_order.py), or config.in_order is True.
        self.in_order = in_order or (lambda: self.config.in_order is True)
        self.cluster = Cluster(zones=q.items, toplevel=q.toplevel, kv=q.kv)
        # Pointer leases lost to another consumer (or a pointer that moved) since start.
        self.lost_pointer_leases = 0
        self._stats_lock = threading.Lock()
        self.leased_total = 0
        # Pickup latency (lease time minus enqueue time) of recent first attempts, for
        # the dashboard (a delayed item counts its delay too).
        self._pickups: deque[int] = deque(maxlen=2000)
        # Every lease's pickup, per tenant, for the fairness view (flushed by the server).
        self.pickup_counts = PickupCounts()
        # Set by an enqueue through this server's Quick: waiting long polls scan at once.
        self._enqueued = threading.Condition()
        self._generation = 0
        # The waits of lease_async: their loops and events, woken with the Condition.
        self._async_waits: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        q.wake_on_enqueue(self)
        self._zone_of: dict[tuple[str, int, str], ZoneId] = {}  # see _remember_zone
        # Commits by other processes (quickzones.store.changes), on stores that can tell.
        self._changes = 0
        self.watcher = watcher_for(q.kv)  # commits by other processes, where the store tells
        # Every admission rule of a visit, as a local consumer's Manager has them: the
        # one fetcher (pauses, weights, the app's and tenants' limits), with the slots
        # this server holds for the items it leases until their remote workers end them.
        self.slots = Slots(
            q.limits,
            f"serve-{uuid.uuid4().hex[:12]}",
            self.config.item_lease_s,
            threading.Lock(),
            self._count,
        )
        self.fetcher = Fetcher(
            self.config,
            q.clock,
            q.limits,
            self.slots,
            self._count,
            pauses=q.pauses,
            weighing=Weighing(self._count, q.tenant_weights),
        )
        self.fetcher.tenant_admission.limits = q.tenant_limit_store
        self.weighing = self.fetcher.weighing
        self.held_slots = HeldSlots(self.slots, q.clock)
        # The outcomes of what it leased (the routes apply a remote worker's through it):
        # each one that ends an item's lease gives back the slots the item held, and a
        # requeued item wakes the waiting polls (it may be due now).
        self.settler = Settler(
            {self.cluster.name: self.cluster}, requeued=q.wake_waiters, ended=self.held_slots.ended
        )

    def _count(self, event: str, **_: Any) -> None:
        """The visits' events: only lost pointer leases are kept (a measure of contention)."""
        if event == "pointer_lease_failed":
            with self._stats_lock:
                self.lost_pointer_leases += 1

    def wake(self) -> None:
        with self._enqueued:
            self._generation += 1
            self._enqueued.notify_all()
            self._wake_async()

    def pickup_percentiles(self) -> tuple[int | None, int | None]:
        """p50 and p99 pickup latency (ms) of the last 2000 first deliveries."""
        with self._stats_lock:
            seen = sorted(self._pickups)
        if not seen:
            return None, None
        return seen[len(seen) // 2], seen[min(len(seen) - 1, (len(seen) * 99) // 100)]

    # --- the scanner ---------------------------------------------------------------------

    def _remember_zone(self, cluster: str, shard: int, pointer_id: str, zone: ZoneId) -> None:
        """A pointer's zone never changes (a zone that loses its pointer gets a new id),
        so scans read each pointer's record once, not at every scan."""
        if len(self._zone_of) >= _ZONES_REMEMBERED:
            self._zone_of.clear()
        self._zone_of[(cluster, shard, pointer_id)] = zone

    def _vested(self, shard: int, app: str | None) -> list[tuple[PointerRef, ZoneId]]:
        """Vested pointers of one shard whose zone belongs to ``app`` (None: any app but
        the cluster's local work), oldest first; snapshot reads, no conflicts."""
        top = self.q.toplevel
        keys = self.q.keys
        begin, end = keys.pointer_vested_range(top.cluster, shard, now_ms(self.q.clock))
        out: list[tuple[PointerRef, ZoneId]] = []
        for _ in range(self.pull.pages_max):
            spoilt: list[tuple[PointerRef, str]] = []

            def page(
                tr: KVTransaction,
                start: bytes = begin,
                spoilt: list[tuple[PointerRef, str]] = spoilt,
            ) -> list[tuple[PointerRef, ZoneId]]:
                tr.set_causal_read_risky()
                spoilt.clear()
                rows = tr.get_range(start, end, limit=self.config.peek_max, snapshot=True)
                found = []
                for key, _ in rows:
                    vesting, pointer_id = keys.unpack_pointer_vesting_key(top.cluster, shard, key)
                    ref = PointerRef(shard, pointer_id, vesting, top.cluster)
                    zone = self._zone_of.get((top.cluster, shard, pointer_id))
                    if zone is None:
                        pkey = keys.pointer_key(top.cluster, shard, pointer_id)
                        raw = tr.get(pkey, snapshot=True)
                        if raw is None:
                            continue
                        try:
                            zone = decode_pointer(pkey, raw).zone
                        except CorruptRecord as err:
                            spoilt.append((ref, err.reason))
                            continue
                        self._remember_zone(top.cluster, shard, pointer_id, zone)
                    found.append((ref, zone))
                return found

            rows = run(self.q.kv, page)
            for ref, reason in spoilt:
                # As a local consumer's pointer lease does: keep the bytes, rebuild the
                # pointer for its zone (vesting now), so the next window leases it.
                set_aside(top, ref, reason)
            out.extend(
                (ref, zone)
                for ref, zone in rows
                if zone.app != LOCAL_APP and (app is None or zone.app == app)
            )
            if out or len(rows) < self.config.peek_max:
                break
            last = rows[-1][0]
            begin = keys.pointer_vesting_key(top.cluster, shard, last.vesting_ms, last.pointer_id)
            begin += b"\x00"
        return out

    def _choose(
        self, app: str | None, visited: set[tuple[int, str]]
    ) -> tuple[list[PointerRef], int, bool]:
        """Algorithm 1's choice among the vested pointers of ``app``'s zones but those
        ``visited`` (shard, pointer id): the pointers, how many were seen vested, and
        whether a window was full (more may be vested)."""
        selection = Selection(self.config, self.rng, self.weighing.by_pointer(self._zone_of.get))
        in_order = self.in_order()
        seen, crowded = 0, False
        shards = list(range(self.q.toplevel.shards))
        self.rng.shuffle(shards)
        for shard in shards:
            if not in_order and selection.full:
                crowded = True  # a shard not even peeked
                continue
            try:
                vested = [
                    ref
                    for ref, _ in self._vested(shard, app)
                    if (ref.shard, ref.pointer_id) not in visited
                ]
            except StorageError:
                continue
            seen += len(vested)
            crowded = crowded or len(vested) >= self.config.peek_max
            selection.add(vested, in_order)
        return selection.chosen(), seen, crowded

    # --- the manager -----------------------------------------------------------------------

    def _visit(
        self, ref: PointerRef, room: int, size: int, lease_ms: int, job_types: frozenset[str] | None
    ) -> ZoneVisit:
        """A Manager's visit to ``ref``'s zone for at most ``room`` items. A job type
        filter looks at the zone's first ``size`` vested items (a local consumer's
        concurrency caps see the same window) and takes at most ``room``; the ids it took
        make a retried transaction take the same ones again."""
        accept: Callable[[dict[str, str]], Callable[[WorkItem], bool]] | None = None
        if job_types is not None:

            def accept(taken: dict[str, str]) -> Callable[[WorkItem], bool]:
                def take(item: WorkItem) -> bool:
                    if item.item_id in taken:
                        return True
                    if len(taken) >= room or item.job_type not in job_types:
                        return False
                    taken[item.item_id] = item.job_type
                    return True

                return take

        v = ZoneVisit(ref, min(room, size) if accept is None else size)
        rules = self.fetcher.rules(item_lease_ms=lease_ms, accept=accept, dequeued=self._dequeued)
        # A weighted zone's turn is its weight times the visit's size, at most the room;
        # with a job-type filter, ``accept`` keeps to the room, and the dequeue must see
        # past the items it skips (a room of 1 would peek only the first, maybe unwanted).
        capacity = None if accept is not None else (lambda: room)
        self.fetcher.visit(self.cluster, [v], rules, capacity)
        return v

    def _dequeued(self, v: ZoneVisit) -> None:
        """Settle the admission the visit took (the unused back) and keep each item's
        slots (its app's, its tenant's) until its remote worker ends it or its lease
        lapses."""
        for item, held in zip(v.items, self.fetcher.took(v), strict=True):
            self.held_slots.hold(v.zone, item.item_id, held.slots(v.zone), item.vesting_ms)

    def _capped(
        self, zone: ZoneId, items: list[WorkItem], caps: Mapping[str, int]
    ) -> list[WorkItem]:
        """The items the job types' pool-wide caps let run (each holds its type's slot
        until its remote worker ends it); the others are given back unstarted, due again
        in 100 ms, as a local Worker gives back an item its type's cap holds back."""
        kept = []
        for item, allowed in zip(items, self.fetcher.pool_slots(items, caps), strict=True):
            if allowed:
                self.held_slots.add(
                    zone, item.item_id, ((TYPE_SCOPE, item.job_type),), item.vesting_ms
                )
                kept.append(item)
                continue
            with contextlib.suppress(QuickError):  # else its lease lapses on its own
                self.settler.requeue(
                    self.cluster.name,
                    zone,
                    item.item_id,
                    item.lease_id or "",
                    100,
                    count_error=False,
                    ran=False,
                )
        return kept

    def lease_once(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        job_types: frozenset[str] | None = None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
    ) -> list[Leased]:
        """One scan and the visits it chooses (and more scans while they take items and
        leave vested zones unchosen); may return nothing. With ``fill_s``, once it holds
        items it visits no more zones ``fill_s`` after the first scan began.
        ``pool_caps``: job type -> its ``pool_max_concurrency`` (the caller's handlers')."""
        return self._lease_once(app, max_items, lease_s, job_types, fill_s, pool_caps)[0]

    def _lease_once(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        job_types: frozenset[str] | None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
    ) -> tuple[list[Leased], int]:
        """The items leased, and how many zones' pointers were leased (and released: two
        commits each) for them."""
        out: list[Leased] = []
        visited = 0
        self.held_slots.tidy()
        # The zones this call visited: not again, so that one call takes at most a
        # visit's share of any zone while others wait (water-filling, invariant 7).
        seen_zones: set[tuple[int, str]] = set()
        fill_until = math.inf if fill_s is None else time.monotonic() + fill_s
        while len(out) < max_items:
            chosen, seen, crowded = self._choose(app, seen_zones)
            # Work-conserving visits (visit_max): the request's room shared over the zones
            # seen vested, as a consumer shares its free workers.
            size = visit_size(self.config, 0 if crowded or not seen else max_items // seen)
            took = 0
            for ref in chosen:
                room = max_items - len(out)
                if room <= 0 or (out and time.monotonic() >= fill_until):
                    break
                v = self._visit(ref, room, size, int(lease_s * 1000), job_types)
                seen_zones.add((ref.shard, ref.pointer_id))
                if v.pointer is not None:
                    visited += 1
                    items = v.items if not pool_caps else self._capped(v.zone, v.items, pool_caps)
                    out.extend(Leased(v.zone, item) for item in items)
                    took += len(items)
            # Another scan only while the last one took items and left vested pointers
            # unchosen (a scanner scans again while managers are free).
            if not took or not (crowded or seen > len(chosen)):
                break
            if out and time.monotonic() >= fill_until:
                break
        now = now_ms(self.q.clock)
        with self._stats_lock:
            self.leased_total += len(out)
            for x in out:
                if x.item.attempts <= 1:
                    self._pickups.append(max(0, now - x.item.enqueued_ms))
        for x in out:
            self.pickup_counts.dequeued(
                zone=x.zone,
                enqueued_ms=x.item.enqueued_ms,
                pickup_ms=now,
                cluster=self.cluster.name,
            )
        return out, visited

    def flush_pickups_until(self, stopping: threading.Event) -> None:
        """Add the pickup counts to the store every ``heartbeat_s`` (a consumer's
        :data:`~quickzones.consumer.maintenance.HEARTBEAT_S`) until ``stopping``, and
        once more then (the fairness view reads them from the store)."""
        store = [(self.cluster.name, self.q.kv, self.q.keys)]
        while not stopping.wait(self.heartbeat_s):
            self.pickup_counts.flush(store, now_ms(self.q.clock))
            self.held_slots.tidy()  # held slots kept while no lease call comes
        self.pickup_counts.flush(store, now_ms(self.q.clock))

    def lease(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        wait_s: float,
        job_types: frozenset[str] | None = None,
        stopping: threading.Event | None = None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
    ) -> list[Leased]:
        """Up to ``max_items`` leased items; waits up to ``wait_s`` for the first one (a
        long poll, like SQS's ReceiveMessage). With ``fill_s`` a scan that holds items
        visits no more zones ``fill_s`` after it began, so the items it holds are handed
        out soon rather than after visits to fill ``max_items``.

        While it waits it scans again when an enqueue through this server's Quick wakes
        it; when the store tells of commits from other processes
        (:mod:`quickzones.store.changes`: SQLite), after each such commit; and at the latest
        every ``poll_s``. A scan that leased zones' pointers and got no item from them
        (their items are of job types it refuses, or another consumer was faster) made
        commits that wake the waiting polls of other servers on the same file, as theirs
        wake it (a store's own commits wake nobody): after each such scan, store changes
        count only once a wait doubling from 1 ms up to ``poll_s`` has passed since it,
        so waiting polls cannot keep each other scanning. A poll that leases nothing
        waits for a change again.

        This waits on the calling thread; :meth:`lease_async` is the same poll that
        holds no thread while it waits (the server's)."""
        poll = _Poll(self, app, max_items, lease_s, wait_s, job_types, stopping, fill_s)
        poll.pool_caps = pool_caps
        while True:
            step = self._step(poll)
            if isinstance(step, list):
                return step
            with step.watch, self._enqueued:
                while (timeout := self._due(step)) is not None:
                    self._enqueued.wait(timeout)

    async def lease_async(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        wait_s: float,
        job_types: frozenset[str] | None = None,
        stopping: threading.Event | None = None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
    ) -> list[Leased]:
        """:meth:`lease` for an event loop: each scan runs on a worker thread (a few
        short transactions), and the waits between scans are the loop's, so a server's
        waiting polls hold no thread each."""
        poll = _Poll(self, app, max_items, lease_s, wait_s, job_types, stopping, fill_s)
        poll.pool_caps = pool_caps
        while True:
            step = await anyio.to_thread.run_sync(self._step, poll)
            if isinstance(step, list):
                return step
            with step.watch:
                await self._wait_async(step)

    def _step(self, poll: _Poll) -> list[Leased] | _Wait:
        """One scan of a long poll: the items to answer with, or (nothing leased and time
        left) what to wait for before the next scan, the store's commits watched from
        before the scan on."""
        seen = (self._generation, self._changes)
        # Commits from here on count; the watcher is only asked to watch (a thread
        # reading the counter every millisecond) while this poll waits.
        watcher = poll.watcher
        version = None if watcher is None else watcher.version()
        scanned = time.monotonic()
        got, visited = self._lease_once(
            poll.app, poll.max_items, poll.lease_s, poll.job_types, poll.fill_s, poll.pool_caps
        )
        now = time.monotonic()
        if got or now >= poll.deadline or (poll.stopping is not None and poll.stopping.is_set()):
            return got
        if visited:
            poll.gap = min(max(poll.gap * 2, 0.001), poll.pause)
        watch = contextlib.ExitStack()
        if watcher is not None and version is not None:
            watch.enter_context(watcher.watching(self._store_changed, since=version))
        wait = _Wait(seen, scanned + poll.gap, min(scanned + poll.pause, poll.deadline), watch)
        poll.pause = min(poll.pause * 2, self.pull.poll_max_s)
        return wait

    def _store_changed(self) -> None:
        with self._enqueued:
            self._changes += 1
            self._enqueued.notify_all()
            self._wake_async()

    def _wake_async(self) -> None:
        """Wake the waits of :meth:`lease_async` (called holding ``_enqueued``)."""
        for loop, event in self._async_waits:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)

    def _due(self, wait: _Wait) -> float | None:
        """None once ``wait`` is over (a local enqueue, a store change seen after its
        ``changes_count_from``, or its ``until``); else how long at most to wait before
        asking again. Called holding ``_enqueued``."""
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
        with self._enqueued:
            self._async_waits.add(waiter)
        try:
            while True:
                event.clear()  # before _due: a wake from here on sets it again
                with self._enqueued:
                    timeout = self._due(wait)
                if timeout is None:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
        finally:
            with self._enqueued:
                self._async_waits.discard(waiter)


class _Poll:
    """One long poll: what it asks for, and its schedule of scans."""

    def __init__(
        self,
        leaser: PullLeaser,
        app: str | None,
        max_items: int,
        lease_s: float,
        wait_s: float,
        job_types: frozenset[str] | None,
        stopping: threading.Event | None,
        fill_s: float | None,
    ) -> None:
        self.app, self.max_items, self.lease_s = app, max_items, lease_s
        self.job_types, self.stopping, self.fill_s = job_types, stopping, fill_s
        self.pool_caps: Mapping[str, int] | None = None  # job type -> pool_max_concurrency
        self.deadline = time.monotonic() + wait_s
        self.pause = leaser.pull.poll_s  # the longest wait to the next scan (doubling)
        self.gap = 0.0  # how long after a scan store changes do not yet count
        self.watcher: CommitWatcher | None = leaser.watcher if wait_s > 0 else None


@dataclass(frozen=True, slots=True)
class _Wait:
    """Between two scans of a poll: the wake-up counters at its scan, from when store
    changes count, until when at most, and the commit watch to leave when it ends."""

    seen: tuple[int, int]
    changes_count_from: float
    until: float
    watch: contextlib.ExitStack

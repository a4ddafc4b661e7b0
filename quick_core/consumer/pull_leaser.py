"""Leases for pull consumers: paper Algorithms 1 and 2 run on behalf of remote workers,
through the consumer's own Scanner and Fetcher.

One :meth:`PullLeaser.lease` call is a scan of the consumer's
:class:`~quickzones.consumer.scanner.Scanner` (Algorithm 1: a random ``selection_frac`` of
each shard's window of ``peek_max``, at most ``selection_max``, the tenant weights' draw;
the oldest first when this server holds its cluster's in-order scanner lease, or with
``in_order=True``), whose peek here reads the vested pointers of the caller's app (paging
past other apps' pointers), so concurrent pull consumers spread over the zones instead of
all contending for the oldest pointer. Each chosen zone is visited through the consumer's
one :class:`~quickzones.consumer.fetcher.Fetcher`, as a Manager visits it (lease the
pointer, dequeue at most ``dequeue_max`` items, or the work-conserving share (capped by
``visit_max``), requeue or collect the pointer) until the call holds ``max_items`` items,
under the same admission rules as a local consumer's visits: the pauses, the tenant
weights, the app's limits, the per-tenant limits, and what the caller sends of its job
types: their named limits and cost, and their pool-wide caps
(:mod:`~quickzones.consumer.pull_admission`); the concurrency slots an item takes are
kept for its remote worker by :mod:`~quickzones.consumer.held_slots` and given back
through the :class:`~quickzones.consumer.settler.Settler` that applies its outcome. A
zone whose visit fails on its own is set aside on its own backoff, as a local consumer's
scanner sets it aside (:mod:`~quickzones.consumer.set_aside`), and the call goes on with
the others. A scan that took items and left vested pointers unchosen is followed by
another. With ``fill_s``, once it holds some items ``fill_s`` after its first scan
began, it visits no more zones, so they do not wait behind many more visits. The waits
of a long poll between scans are :mod:`~quickzones.consumer.long_poll`'s.

The server's leaser is configured by a :class:`~quickzones.consumer.config.ConsumerConfig`
(the scanner's and visit's parameters, the same fields as a local consumer's; its worker,
routing and timer fields do not apply) and a :class:`PullConfig` of what only a server
has: the long poll's waits and how far a scan pages past other apps' pointers.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quickzones.clock import now_ms
from quickzones.consumer.app_peek import AppPointers
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.fetcher import Fetcher
from quickzones.consumer.held_slots import HeldSlots
from quickzones.consumer.limit_gate import LimitRefs as LimitRefs  # the routes' argument
from quickzones.consumer.long_poll import LongPolls, Poll
from quickzones.consumer.maintenance import HEARTBEAT_S
from quickzones.consumer.pickups import PickupCounts, waited_ms
from quickzones.consumer.pull_admission import PullAdmission
from quickzones.consumer.pull_runs import PullRuns
from quickzones.consumer.scanner import Scanner
from quickzones.consumer.set_aside import SetAside, VisitFailures, elapsed
from quickzones.consumer.settler import Settler
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_rules import ZoneVisit, ZoneVisitsFailed, visit_size
from quickzones.consumer.weighing import Weighing
from quickzones.errors import QuickError
from quickzones.store.changes import watcher_for
from quickzones.store.records import WorkItem, ZoneId
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
        heartbeat_s: float = HEARTBEAT_S,  # how often it beats and flushes; shorter in tests
        in_order: Callable[[], bool] | None = None,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        self.q = q
        self.heartbeat_s = heartbeat_s
        self.config = config or ConsumerConfig()
        self.config.validate()
        self.pull = pull or PullConfig()
        self.rng = random.Random(self.config.seed)
        # in_order(): asked once a scan (it may take a turn); leads(): only whether it leads.
        self.in_order = in_order or (lambda: self.config.in_order is True)
        self.leads = leads or (lambda: self.config.in_order is True)
        # Its slots' holder, its heartbeat's id, and its pointer leases' holder.
        self.name = f"serve-{uuid.uuid4().hex[:12]}"
        self.cluster = Cluster(zones=q.items, toplevel=q.toplevel, kv=q.kv, holder=self.name)
        # Pointer leases lost to another consumer (or a pointer that moved) since start.
        self.lost_pointer_leases = 0
        self._stats_lock = threading.Lock()
        self.leased_total = 0
        # Pickup latency (lease time minus vesting time: a delay is asked for, not
        # waited) of recent first attempts, for the dashboard.
        self._pickups: deque[int] = deque(maxlen=2000)
        # Every lease's pickup, per tenant, for the fairness view (flushed by the server).
        self.pickup_counts = PickupCounts()
        self.app_pointers = AppPointers(self.pull.pages_max)  # the scans' peeks
        # The long polls' waits: an enqueue through this server's Quick wakes them, and
        # commits by other processes where the store tells (quickzones.store.changes).
        self.watcher = watcher_for(q.kv)
        self.polls: LongPolls[PullRequest, Leased] = LongPolls(
            self._lease_once, self.watcher, self.pull.poll_max_s
        )
        q.wake_on_enqueue(self)
        # Every admission rule of a visit, as a local consumer's Manager has them: the
        # one fetcher (pauses, weights, the app's and tenants' limits), with the slots
        # this server holds for the items it leases until their remote workers end them.
        self.slots = Slots(
            q.limits,
            self.name,
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
        # Zones whose visits failed on their own, each passed over on its own backoff,
        # as a local consumer's scanner passes over them.
        self.set_aside = SetAside(self._count, monotonic=elapsed(q.clock))
        self.held_slots = HeldSlots(self.slots, q.clock)
        # What its leases hold for remote workers, in its heartbeat (the running page).
        self.pull_runs = PullRuns(
            q, self.name, self.config, self.leads, heartbeat_s, self.pickup_counts
        )
        # The outcomes of what it leased (the routes apply a remote worker's through it):
        # each one that ends an item's lease gives back the slots the item held and counts
        # its run, and a requeued item wakes the waiting polls (it may be due now).
        self.settler = Settler(
            {self.cluster.name: self.cluster}, requeued=q.wake_waiters, ended=self.ended
        )
        self.admission = PullAdmission(  # named limits and pool-wide caps of its items
            self.fetcher, self.held_slots, q.limits, q.named_limits, q.clock, self._count,
            self._give_back)  # fmt: skip

    def ended(self, zone: ZoneId, item_id: str, how: str) -> None:
        """A leased item's run is over (outcome, or cancelled): its slots are freed."""
        self.held_slots.ended(zone, item_id)
        self.pull_runs.ended(zone, item_id, how)

    def _count(self, event: str, **_: Any) -> None:
        """The visits' events: only lost pointer leases are kept (a measure of contention)."""
        if event == "pointer_lease_failed":
            with self._stats_lock:
                self.lost_pointer_leases += 1

    def wake(self) -> None:
        """Waiting long polls scan again now (an enqueue through this server's Quick)."""
        self.polls.wake()

    def pickup_percentiles(self) -> tuple[int | None, int | None]:
        """p50 and p99 pickup latency (ms) of the last 2000 first deliveries."""
        with self._stats_lock:
            seen = sorted(self._pickups)
        if not seen:
            return None, None
        return seen[len(seen) // 2], seen[min(len(seen) - 1, (len(seen) * 99) // 100)]

    # --- the scanner ---------------------------------------------------------------------

    def _scanner(self, request: PullRequest, visited: set[tuple[int, str]]) -> Scanner:
        """Algorithm 1 for one lease call: the consumer's Scanner over this server's
        cluster, peeking ``request``'s app's pointers, passing over the zones this call
        ``visited`` and those set aside, with the request's room as its capacity."""
        return Scanner(
            self.config,
            {self.cluster.name: self.cluster},
            self.rng,
            in_order_for=lambda _: self.in_order(),
            refresh_election=lambda: None,  # the server's in_order.py keeps the election
            capacity=lambda: request.max_items,
            emit=self._count,
            skip=lambda ref: (ref.shard, ref.pointer_id) in visited,
            clock=self.q.clock,
            weighing=self.weighing,
            set_aside=self.set_aside,
            peek=functools.partial(self.app_pointers.peek, request.app),
            zone_of=self.cluster.toplevel.zone_read,
        )

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

    def _give_back(self, zone: ZoneId, item: WorkItem, delay_ms: int) -> None:
        with contextlib.suppress(QuickError):  # else its lease lapses on its own
            self.settler.requeue(
                self.cluster.name,
                zone,
                item.item_id,
                item.lease_id or "",
                delay_ms,
                count_error=False,
                ran=False,
            )

    def lease_once(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        job_types: frozenset[str] | None = None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
        named_limits: Mapping[str, LimitRefs] | None = None,
    ) -> list[Leased]:
        """One scan and the visits it chooses (and more scans while they take items and
        leave vested zones unchosen); may return nothing. With ``fill_s``, once it holds
        items it visits no more zones ``fill_s`` after the first scan began.
        ``pool_caps``: job type -> its ``pool_max_concurrency``; ``named_limits``: job
        type -> the named limits it takes and its cost (both the caller's handlers')."""
        request = PullRequest(app, max_items, lease_s, job_types, fill_s, pool_caps, named_limits)
        return self._lease_once(request)[0]

    def _lease_once(self, request: PullRequest) -> tuple[list[Leased], int]:
        """The items leased, and how many zones' pointers were leased (and released: two
        commits each) for them."""
        out: list[Leased] = []
        visited = 0
        max_items = request.max_items
        self.held_slots.tidy()
        # The zones this call visited: not again, so that one call takes at most a
        # visit's share of any zone while others wait (water-filling, invariant 7).
        seen_zones: set[tuple[int, str]] = set()
        scanner = self._scanner(request, seen_zones)
        failures = VisitFailures(scanner.set_aside)
        fill_until = math.inf if request.fill_s is None else time.monotonic() + request.fill_s
        while len(out) < max_items:
            chosen = scanner.scan_once()
            # Work-conserving visits (visit_max): the request's room shared over the zones
            # seen vested, as a consumer shares its free workers.
            size = visit_size(self.config, scanner.share)
            took = 0
            for ref in chosen:
                room = max_items - len(out)
                if room <= 0 or (out and time.monotonic() >= fill_until):
                    break
                seen_zones.add((ref.shard, ref.pointer_id))
                try:
                    v = self._visit(ref, room, size, int(request.lease_s * 1000), request.job_types)
                except ZoneVisitsFailed as err:
                    failures.failed(err)
                    failures.store_failing()
                    continue
                failures.worked(ref)
                if v.pointer is not None:
                    visited += 1
                    items = v.items
                    if request.pool_caps or request.named_limits:
                        items = self.admission.admitted(
                            v.zone, items, request.named_limits or {}, request.pool_caps or {}
                        )
                    out.extend(Leased(v.zone, item) for item in items)
                    took += len(items)
            # Another scan only while the last one took items and left vested pointers
            # unchosen (a scanner scans again while managers are free).
            if not took or not scanner.left_vested:
                break
            if out and time.monotonic() >= fill_until:
                break
        now = now_ms(self.q.clock)
        with self._stats_lock:
            self.leased_total += len(out)
            for x in out:
                if x.item.attempts <= 1:
                    self._pickups.append(waited_ms(x.item.enqueued_ms, now, x.item.vested_ms))
        for x in out:
            self.pickup_counts.dequeued(
                zone=x.zone,
                enqueued_ms=x.item.enqueued_ms,
                vested_ms=x.item.vested_ms,
                pickup_ms=now,
                cluster=self.cluster.name,
            )
            self.pull_runs.leased(x.zone, x.item, now)
        return out, visited

    def beat_until(self, stopping: threading.Event) -> None:
        """Its heartbeat (:mod:`~quickzones.consumer.pull_runs`: its pull leases' record,
        pickup and run counts) every ``heartbeat_s`` until ``stopping``, and at the end."""
        while not stopping.wait(self.heartbeat_s):
            self.pull_runs.heartbeats.beat_once()
            self.held_slots.tidy()  # held slots kept while no lease call comes
        self.pull_runs.heartbeats.stopped()

    def poll(
        self,
        app: str | None,
        max_items: int,
        lease_s: float,
        wait_s: float,
        job_types: frozenset[str] | None = None,
        stopping: threading.Event | None = None,
        fill_s: float | None = None,
        pool_caps: Mapping[str, int] | None = None,
        named_limits: Mapping[str, LimitRefs] | None = None,
    ) -> Poll[PullRequest]:
        """A long poll for up to ``max_items`` items, waiting up to ``wait_s`` for the
        first one (:mod:`~quickzones.consumer.long_poll`). With ``fill_s`` a scan that
        holds items visits no more zones ``fill_s`` after it began, so the items it holds
        are handed out soon rather than after visits to fill ``max_items``."""
        request = PullRequest(app, max_items, lease_s, job_types, fill_s, pool_caps, named_limits)
        return Poll(request, wait_s, self.pull.poll_s, self.watcher, stopping)

    def lease(self, *args: Any, **kwargs: Any) -> list[Leased]:
        """:meth:`poll`'s items (its arguments), waiting on the calling thread."""
        return self.polls.wait(self.poll(*args, **kwargs))

    async def lease_async(self, poll: Poll[PullRequest]) -> list[Leased]:
        """A :meth:`poll`'s items for an event loop (the server's): each scan runs on a
        worker thread (anyio's, which the `serve` extra brings), and the waits between
        scans are the loop's, so an open poll holds no thread."""
        import anyio.to_thread  # only a server's event loop calls this

        return await self.polls.wait_async(poll, anyio.to_thread.run_sync)


@dataclass(frozen=True, slots=True)
class PullRequest:
    """What one lease call asks for."""

    app: str | None
    max_items: int
    lease_s: float
    job_types: frozenset[str] | None = None
    fill_s: float | None = None
    pool_caps: Mapping[str, int] | None = None  # job type -> its pool_max_concurrency
    named_limits: Mapping[str, LimitRefs] | None = None  # job type -> its limits and cost

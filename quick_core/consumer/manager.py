"""A Manager: the consumer's side of paper Algorithm 2 (the visit itself, its lease,
dequeue and requeue, is :mod:`quickzones.consumer.visit`).

A visit dequeues up to ``dequeue_max`` vested items of a zone (invariant 7: water-filling
fairness), cut to this consumer's free ``processing_bound``, the app's limits and each job
type's ``max_concurrency``: the Manager decides that room, reserves the per-type places,
counts the items in flight and hands them to Workers (Algorithm 3) as
:class:`~quickzones.consumer.state.Work`; a Manager runs no handler.

Work-conserving (beyond the paper; ``visit_max`` caps it, and ``visit_max=dequeue_max``
turns it off): a visit takes the water-filling share of the consumer's free capacity over
the zones the last scan saw vested, when that is more than ``dequeue_max``. A tenant alone
in the queue then fills the free room in one visit; when many zones compete the share falls below
``dequeue_max`` and each visit stays at ``dequeue_max`` (invariant 7).

One-transaction visits (``one_transaction_visits``) and batched ones
(``visits_per_transaction``, :meth:`Manager.visit_many`), beyond the paper, are forms of
the same visit (:class:`~quickzones.consumer.visit.ZoneVisitor`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster, InFlight, Work
from quickzones.consumer.tenant_admission import TenantAdmission, TenantHold, slots_of
from quickzones.consumer.visit import (
    Admission,
    NeedsThreeTransactions,
    VisitRules,
    ZoneVisit,
    ZoneVisitor,
    visit_size,
)
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.consumer.weighing import Weighing
from quickzones.errors import StorageError
from quickzones.registry import Registry
from quickzones.store.kv import KVTransaction
from quickzones.store.limits import Limits
from quickzones.store.pauses import Pauses, PauseSet
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef
from quickzones.store.zonestore import CorruptItem

log = logging.getLogger("quick.consumer")

# Given the visit's reservations (item id -> job type), the predicate a dequeue admits
# items with.
AcceptFactory = Callable[[dict[str, str]], Callable[[WorkItem], bool]]


class Manager:
    """Algorithm 2: one zone visit at a time per calling thread (managers share it)."""

    # Routing (set by the consumer when limited to apps): read before leasing a pointer.
    accept_pointer: Callable[[PointerRef, ZoneId], bool] | None = None

    def __init__(
        self,
        config: ConsumerConfig,
        clusters: dict[str, Cluster],
        registry: Registry,
        clock: Clock,
        in_flight: InFlight,
        slots: Slots,
        limits: Limits | None,
        *,
        emit: Callable[..., Any],
        accept: AcceptFactory | None = None,
        share: Callable[[], int] = lambda: 0,
        pauses: Pauses | None = None,
        weighing: Weighing | None = None,
        wake_scanner: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.clusters = clusters
        self.registry = registry
        self.clock = clock
        self.in_flight = in_flight
        self.slots = slots
        self.limits = limits
        self.emit = emit
        # A test hook: the admission predicate factory, injected (default: self.accept).
        self.accept_factory: AcceptFactory = accept or self.accept
        self.share = share  # the scanner's water-filling share of the free capacity
        self.pauses = pauses  # paused apps, tenants, job types (read at most once a second)
        # Tenant weights (Quick.consumer gives the store's), shared with the scanner.
        self.weighing = weighing or Weighing(emit)
        # Per-tenant limits; a zone held at a cap is woken when an item of it ends here.
        self.tenant_admission = TenantAdmission(limits, slots, clock, emit, wake_scanner)
        self.one_transaction = OneTransactionGate(config.one_transaction_visits, clock)
        self.visitor = ZoneVisitor(self.one_transaction, clock, emit)

    def visit_size(self) -> int:
        """How many items a visit may take, before the free capacity and the limits."""
        return visit_size(self.config, self.share())

    def claim_size(self, refs: Sequence[PointerRef]) -> int:
        """The room to claim for visiting ``refs``: :meth:`visit_size` each, times the
        tenant's weight where more than 1 (consumer.weighing)."""
        size = self.visit_size()
        weight = self.weighing.by_pointer()
        if weight is None:
            return size * len(refs)
        return sum(max(size, round(size * weight(ref))) for ref in refs)

    def resolve(self, item: WorkItem) -> WorkItem:
        """Apply this consumer's job type options to an item whose producer did not know
        them: a producer need not import the handlers to enqueue for an at-most-once or
        TTL job type."""
        job = self.registry.find(item.job_type)
        if job is None:
            return item
        changes: dict[str, Any] = {}
        if job.delivery == "at_most_once" and item.delivery != "at_most_once":
            changes["delivery"] = "at_most_once"
        if job.ttl_s is not None and item.deadline_ms is None:
            changes["deadline_ms"] = item.enqueued_ms + int(job.ttl_s * 1000)
        return item.with_(**changes) if changes else item

    def accept(self, reserved: dict[str, str]) -> Callable[[WorkItem], bool]:
        """Admit an item under its job type's per-consumer cap, reserving its place in
        the per-type count at once (under the lock): managers dequeue concurrently, and a
        check that counted only items already handed over let each of them fill the cap.
        ``reserved`` (item id -> job type) makes a retried dequeue attempt that sees the
        same item again reserve it once; :meth:`settle` converts or returns them."""
        flight = self.in_flight

        def accept(item: WorkItem) -> bool:
            job = self.registry.find(item.job_type)
            if job is None or job.max_concurrency is None:
                return True
            with flight.lock:
                if item.item_id in reserved:
                    return True
                if flight.per_type[item.job_type] >= job.max_concurrency:
                    return False
                flight.per_type[item.job_type] += 1
                reserved[item.item_id] = item.job_type
            return True

        return accept

    def settle(self, reserved: dict[str, str], items: Sequence[WorkItem]) -> None:
        """Count ``items`` in flight: the reserved ones already are; reservations of items
        the dequeue did not return are given back."""
        flight = self.in_flight
        with flight.lock:
            flight.count += len(items)
            for item in items:
                if reserved.pop(item.item_id, None) is None:
                    flight.per_type[item.job_type] += 1
            for job_type in reserved.values():
                flight.per_type[job_type] -= 1
            reserved.clear()

    def rules(
        self, hand_out: Callable[[list[Work]], None] | None, horizon_ms: int, works: list[Work]
    ) -> VisitRules:
        """This consumer's side of a visit: its routing, job options and app limits; the
        items each zone gives are counted in flight and handed out, into ``works``."""

        def dequeued(v: ZoneVisit) -> None:
            self.settle(v.reserved, v.items)
            works.extend(
                self.dequeued(
                    self.clusters[v.ref.cluster],
                    v.ref,
                    v.zone,
                    v.items,
                    v.corrupt,
                    v.app_slots,
                    hand_out,
                    v.tenant_hold,
                )
            )

        self.tenant_admission.prepare()  # read before any visit's transaction
        return VisitRules.of(
            self.config,
            horizon_ms=horizon_ms,
            accept_pointer=self.accept_pointer,
            resolve=self.resolve,
            accept=self.accept_factory,
            admit=self.admit,
            paused=self.paused(),
            weight=self.weighing.visit_rule(),
            dequeued=dequeued,
            # Workers take what is handed out; what waits for one is leased held.
            start_now=None if hand_out is None else self.in_flight.startable,
        )

    def paused(self) -> PauseSet | None:
        """The pauses in force (None: none kept in a store); while the store cannot be
        read, the last ones read (the error is reported, and the next visit reads again)."""
        if self.pauses is None:
            return None
        try:
            return self.pauses.current()
        except StorageError as err:
            self.emit("limits_error", error=str(err))
            return self.pauses.last

    def visit(
        self,
        ref: PointerRef,
        hand_out: Callable[[list[Work]], None] | None = None,
        *,
        horizon_ms: int = 0,
    ) -> list[Work]:
        """Lease the pointer, dequeue up to :meth:`visit_size` items (at most the free
        capacity), requeue the pointer at the zone's minimum vesting time or collect it if
        the zone stayed empty (:mod:`quickzones.consumer.visit`).

        ``hand_out`` (the threaded runtime's dispatch to workers) gets the items as soon
        as they are dequeued, before the pointer's requeue commits: the items' own leases
        already protect them, and a handler need not wait for one more commit (a timer's
        lateness is the sum of the commits before its handler starts).

        ``horizon_ms`` (the runtime's timer lookahead; stores with ``lookahead_dequeue``):
        the pointer and items vesting within that many ms are taken too; such an item's
        :class:`Work` carries ``due_ms``, its vesting time, and must not start before."""
        return self._visit([ref], hand_out, horizon_ms)

    def visit_many(
        self,
        refs: Sequence[PointerRef],
        hand_out: Callable[[list[Work]], None] | None = None,
        *,
        horizon_ms: int = 0,
    ) -> list[Work]:
        """Visit ``refs`` (``visits_per_transaction`` at most at a time): per cluster whose
        zones allow one-transaction visits, all in one transaction; else, or when that
        transaction is written off, one :meth:`visit` each."""
        by_cluster: dict[str, list[PointerRef]] = defaultdict(list)
        for ref in refs:
            by_cluster[ref.cluster].append(ref)
        works: list[Work] = []
        size = self.config.visits_at_once()
        for group in by_cluster.values():
            for start in range(0, len(group), size):
                works += self._visit(group[start : start + size], hand_out, horizon_ms)
        return works

    def _visit(
        self,
        refs: Sequence[PointerRef],
        hand_out: Callable[[list[Work]], None] | None,
        horizon_ms: int,
    ) -> list[Work]:
        """One :class:`ZoneVisitor` visit of ``refs`` (one cluster's)."""
        works: list[Work] = []
        size = self.visit_size()
        visits = [ZoneVisit(ref, size) for ref in refs]
        cluster = self.clusters[refs[0].cluster]
        top = cluster.toplevel
        try:
            self.visitor.visit(
                cluster,
                visits,
                self.rules(hand_out, horizon_ms, works),
                self.in_flight.capacity,
            )
        finally:
            for v in visits:
                self.settle(v.reserved, [])  # reservations no dequeue used
                if v.outcome == "requeued":
                    self.tenant_admission.requeued(top, v.zone, v.tenant_hold)
        return works

    def admit(self, zone: ZoneId, room: int, tr: KVTransaction | None) -> Admission:
        """The app's limits on a leased zone (:meth:`apply_app_limits`); inside a
        transaction (a one-transaction visit) an app with limits sends the zone to the
        three transactions."""
        if self.limits is None:
            return Admission(room)
        tenant_limits = self.tenant_admission.of(zone)
        if tr is not None:
            if tenant_limits or self.limits.get(zone.app, tr).limits_dispatch:
                raise NeedsThreeTransactions
            return Admission(room)
        room, not_before, taken = self.apply_app_limits(zone, room)
        # No room when the limits cannot be read: its unused app slots are released.
        room, later, hold = self.tenant_admission.limit(zone, room)
        if later is not None:
            not_before = later if not_before is None else max(not_before, later)
        return Admission(room, not_before, taken, hold)

    def dequeued(
        self,
        cluster: Cluster,
        ref: PointerRef,
        zone: ZoneId,
        items: list[WorkItem],
        corrupt: list[CorruptItem],
        app_slots: int,
        hand_out: Callable[[list[Work]], None] | None,
        tenant_hold: TenantHold | None = None,
    ) -> list[Work]:
        """Report a visit's dequeue and hand its items out to workers."""
        held = [] if tenant_hold is None else self.tenant_admission.settle(zone, tenant_hold, items)
        for bad in corrupt:
            log.warning("dead-lettered corrupt item %s in %s: %s", bad.item_id, zone, bad.reason)
            self.emit("dead_lettered", zone=zone, item_id=bad.item_id, reason="corrupt")
        self.emit("visited", zone=zone, items=len(items))
        if app_slots > len(items):
            self.slots.release("app", zone.app, app_slots - len(items))
        now = self.clock.now()
        now_at = now_ms(self.clock)
        lease_ms = int(self.config.item_lease_s * 1000)
        works = []
        pointer_key = (ref.cluster, ref.shard, ref.pointer_id)
        self.weighing.took(pointer_key, zone, len(items))  # its turn (consumer.weighing)
        for item in items:
            # A lease taken ahead runs from the item's vesting time (KVZoneStore.dequeue).
            due = item.vesting_ms - lease_ms
            works.append(
                Work(
                    zone,
                    item,
                    now,
                    app_slot=app_slots > 0,
                    cluster=cluster.name,
                    due_ms=due if due > now_at else None,
                    pointer_key=pointer_key,
                    tenant_slots=slots_of(item, held) if held else (),
                )
            )
        self.in_flight.handed_out(works)
        for w in works:  # picked up when the visit's items were (one clock read a visit)
            self.emit(
                "dequeued",
                zone=zone,
                item_id=w.item.item_id,
                job_type=w.item.job_type,
                enqueued_ms=w.item.enqueued_ms,
                pickup_ms=now_at,
                cluster=cluster.name,
            )
        if hand_out is not None and works:
            hand_out(works)
        return works

    def apply_app_limits(self, zone: ZoneId, room: int) -> tuple[int, int | None, int]:
        """Cut ``room`` to the app's dispatch rate and pool-wide concurrency cap.

        Returns (room, not_before_ms, app_slots_taken); ``not_before_ms`` is set when the
        app's rate limit is what stopped it, so its pointer waits for the next window.
        """
        if self.limits is None:
            return room, None, 0
        try:
            limits = self.limits.get(zone.app)
            not_before = None
            taken = 0
            if limits.max_concurrency is not None:
                taken = self.slots.acquire("app", zone.app, room, limits.max_concurrency)
                room = taken
                if room == 0:
                    self.emit("throttled", zone=zone, reason="app concurrency cap")
            if room > 0 and limits.dispatches_per_second is not None:
                granted, window = self.limits.grant_dispatch(zone.app, room)
                if granted < room:
                    not_before = window
                    self.emit("throttled", zone=zone, reason="app dispatch rate")
                    if taken > granted:
                        self.slots.release("app", zone.app, taken - granted)
                        taken = granted
                room = granted
            return room, not_before, taken
        except StorageError as err:
            self.emit("limits_error", zone=zone, error=str(err))
            return 0, None, 0

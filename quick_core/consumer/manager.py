"""A Manager: the consumer's side of paper Algorithm 2 (the visit itself, its lease,
dequeue and requeue, is :mod:`quickzones.consumer.visit`).

A visit dequeues up to ``dequeue_max`` vested items of a zone (invariant 7: water-filling
fairness), cut to this consumer's free ``processing_bound``, the app's and tenant's limits
and each job type's ``max_concurrency``: those rules and the visit are the one
:class:`~quickzones.consumer.fetcher.Fetcher` (``quick serve``'s pull leases use the same);
the Manager sizes its visits, counts the items in flight and hands them to Workers
(Algorithm 3) as :class:`~quickzones.consumer.state.Work`; a Manager runs no handler.

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

from quickzones.clock import Clock
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.fetcher import Fetcher
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster, InFlight, Work
from quickzones.consumer.tenant_admission import TenantAdmission
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.consumer.visit_rules import (
    Admission,
    VisitRules,
    ZoneVisit,
    ZoneVisitsFailed,
    visit_size,
)
from quickzones.consumer.weighing import Weighing
from quickzones.registry import Registry
from quickzones.store.kv import KVTransaction
from quickzones.store.limits import Limits
from quickzones.store.pauses import Pauses, PauseSet
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef

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
        requeued: Callable[[tuple[str, int, str], int | None], None] = lambda key, ms: None,
    ) -> None:
        self.config = config
        self.clusters = clusters
        self.registry = registry
        self.clock = clock
        self.in_flight = in_flight
        self.slots = slots
        self.limits = limits
        self.emit = emit
        # Every admission rule and the visit itself: the one fetcher, as quick serve's
        # pull leases have it (quickzones.consumer.fetcher).
        self.fetcher = Fetcher(
            config,
            clock,
            limits,
            slots,
            emit,
            registry=registry,
            in_flight=in_flight,
            pauses=pauses,
            weighing=weighing,
            wake_scanner=wake_scanner,
            requeued=requeued,
        )
        # A test hook: the admission predicate factory, injected (default: self.accept).
        self.accept_factory: AcceptFactory = accept or self.accept
        self.share = share  # the scanner's water-filling share of the free capacity

    # The fetcher's parts, as the consumer's wiring and its tests reach them.
    @property
    def pauses(self) -> Pauses | None:
        return self.fetcher.pauses

    @pauses.setter
    def pauses(self, pauses: Pauses | None) -> None:
        self.fetcher.pauses = pauses

    @property
    def weighing(self) -> Weighing:
        return self.fetcher.weighing

    @property
    def tenant_admission(self) -> TenantAdmission:
        return self.fetcher.tenant_admission

    @property
    def one_transaction(self) -> OneTransactionGate:
        return self.fetcher.one_transaction

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
        """Each job type's per-consumer cap (:meth:`Fetcher.accept`)."""
        return self.fetcher.accept(reserved)

    def settle(self, reserved: dict[str, str], items: Sequence[WorkItem]) -> None:
        """Count ``items`` in flight (:meth:`Fetcher.settle`)."""
        self.fetcher.settle(reserved, items)

    def rules(
        self, hand_out: Callable[[list[Work]], None] | None, horizon_ms: int, works: list[Work]
    ) -> VisitRules:
        """This consumer's side of a visit: its routing, job options and per-type caps,
        with the fetcher's admission rules; the items each zone gives are counted in
        flight and handed out, into ``works``."""

        def dequeued(v: ZoneVisit) -> None:
            self.settle(v.reserved, v.items)
            works.extend(self.dequeued(self.clusters[v.ref.cluster], v, hand_out))

        return self.fetcher.rules(
            horizon_ms=horizon_ms,
            accept_pointer=self.accept_pointer,
            resolve=self.resolve,
            accept=self.accept_factory,
            dequeued=dequeued,
            # Workers take what is handed out; what waits for one is leased held.
            start_now=None if hand_out is None else self.in_flight.startable,
            taking=None if hand_out is None else self.in_flight.taking,
        )

    def paused(self, zone: ZoneId) -> PauseSet | None:
        """The pauses over ``zone`` (:meth:`Fetcher.paused`)."""
        return self.fetcher.paused(zone)

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
        failed: Callable[[ZoneVisitsFailed], None] | None = None,
    ) -> list[Work]:
        """Visit ``refs`` (``visits_per_transaction`` at most at a time): per cluster whose
        zones allow one-transaction visits, all in one transaction; else, or when that
        transaction is written off, one :meth:`visit` each. ``failed`` hears of the zones
        whose visits failed on their own, and the works of the others are returned; None:
        they raise :class:`ZoneVisitsFailed` (the threaded runtime hands works out as
        they come)."""
        by_cluster: dict[str, list[PointerRef]] = defaultdict(list)
        for ref in refs:
            by_cluster[ref.cluster].append(ref)
        works: list[Work] = []
        size = self.config.visits_at_once()
        for group in by_cluster.values():
            for start in range(0, len(group), size):
                try:
                    works += self._visit(group[start : start + size], hand_out, horizon_ms)
                except ZoneVisitsFailed as err:
                    if failed is None:
                        raise
                    works += err.works
                    failed(err)
        return works

    def _visit(
        self,
        refs: Sequence[PointerRef],
        hand_out: Callable[[list[Work]], None] | None,
        horizon_ms: int,
    ) -> list[Work]:
        """One fetcher visit of ``refs`` (one cluster's)."""
        works: list[Work] = []
        size = self.visit_size()
        visits = [ZoneVisit(ref, size) for ref in refs]
        cluster = self.clusters[refs[0].cluster]
        try:
            self.fetcher.visit(
                cluster, visits, self.rules(hand_out, horizon_ms, works), self.in_flight.capacity
            )
        except ZoneVisitsFailed as err:
            err.works = works  # the other zones' items, dequeued and leased: not lost
            raise
        finally:
            for v in visits:
                self.settle(v.reserved, [])  # reservations no dequeue used
        return works

    def admit(self, zone: ZoneId, room: int, tr: KVTransaction | None) -> Admission:
        """The app's and tenant's limits on a leased zone (:meth:`Fetcher.admit`)."""
        return self.fetcher.admit(zone, room, tr)

    def dequeued(
        self,
        cluster: Cluster,
        v: ZoneVisit,
        hand_out: Callable[[list[Work]], None] | None,
    ) -> list[Work]:
        """Report a visit's dequeue and hand its items out to workers, each with the
        slots it holds until its handler ends (:meth:`Fetcher.took`)."""
        zone, items, ref = v.zone, v.items, v.ref
        held = self.fetcher.took(v)
        for bad in v.corrupt:
            log.warning("dead-lettered corrupt item %s in %s: %s", bad.item_id, zone, bad.reason)
            self.emit("dead_lettered", zone=zone, item_id=bad.item_id, reason="corrupt")
        self.emit("visited", zone=zone, items=len(items))
        now = self.clock.now()
        now_at = int(now * 1000)  # now_ms of the same reading: one clock read a visit
        lease_ms = int(self.config.item_lease_s * 1000)
        works = []
        pointer_key = (ref.cluster, ref.shard, ref.pointer_id)
        for item, holds in zip(items, held, strict=True):
            # A lease taken ahead runs from the item's vesting time (KVZoneStore.dequeue).
            due = item.vesting_ms - lease_ms
            works.append(
                Work(
                    zone,
                    item,
                    now,
                    app_slot=holds.app_slot,
                    cluster=cluster.name,
                    due_ms=due if due > now_at else None,
                    pointer_key=pointer_key,
                    tenant_slots=holds.tenant_slots,
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
                vested_ms=w.item.vested_ms,  # pickups count from here (None: enqueued_ms)
                pickup_ms=now_at,
                cluster=cluster.name,
            )
        if hand_out is not None and works:
            hand_out(works)
        return works

    def apply_app_limits(self, zone: ZoneId, room: int) -> tuple[int, int | None, int]:
        """The app's rate and pool-wide cap (:meth:`Fetcher.apply_app_limits`)."""
        return self.fetcher.apply_app_limits(zone, room)

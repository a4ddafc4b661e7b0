"""The fetcher: which items a zone visit (paper Algorithm 2) may take, and the visit
itself, for every path that takes items out of the queue (issue 40 point 7).

A consumer's :class:`~quickzones.consumer.manager.Manager` and ``quick serve``'s pull
leases (:mod:`quickzones.consumer.pull_leaser`) both visit through one :class:`Fetcher`, so
one set of admission rules holds for a local worker and a remote one alike:

* the room the caller has (Algorithm 1, line 5: a consumer's free ``processing_bound``, a
  pull request's ``max_items``), passed to :meth:`Fetcher.visit` as ``capacity``;
* the pauses over the zone (:mod:`quickzones.store.pauses`): a paused zone gives nothing;
* the tenant weights (:class:`~quickzones.consumer.weighing.Weighing`): a zone's turn;
* the app's limits (:class:`~quickzones.store.limits.AppLimits`): its pool-wide
  ``max_concurrency`` (slots in the limits store, held by each item until it ends) and its
  ``dispatches_per_second`` (:meth:`Fetcher.apply_app_limits`);
* the tenant's limits (:class:`~quickzones.consumer.tenant_admission.TenantAdmission`);
* a job type's per-consumer ``max_concurrency`` (:meth:`Fetcher.accept`, reserving places
  in the caller's :class:`~quickzones.consumer.state.InFlight`), and its pool-wide
  ``pool_max_concurrency`` for items leased to remote workers (:meth:`Fetcher.pool_slots`;
  a local Worker takes its slot as the handler starts).

What each dequeued item holds until it ends (an app slot, its tenant's slots) is said by
:meth:`Fetcher.took`; a local Worker releases it as its handler ends, the server's
:mod:`~quickzones.consumer.held_slots` when the remote worker's outcome arrives
(through :mod:`quickzones.consumer.settler`) or its lease lapses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quickzones.clock import Clock
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster, InFlight
from quickzones.consumer.tenant_admission import SCOPE, Name, TenantAdmission, slots_of
from quickzones.consumer.visit import ZoneVisitor
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.consumer.visit_rules import (
    Admission,
    NeedsThreeTransactions,
    VisitRules,
    ZoneVisit,
)
from quickzones.consumer.weighing import Weighing
from quickzones.errors import StorageError
from quickzones.registry import Registry
from quickzones.store.kv import KVTransaction
from quickzones.store.limits import Limits, SlotName
from quickzones.store.pauses import Pauses, PauseSet
from quickzones.store.records import WorkItem, ZoneId

APP_SCOPE = "app"  # an app's pool-wide concurrency slots in Limits
TYPE_SCOPE = "type"  # a job type's (pool_max_concurrency)


@dataclass(frozen=True, slots=True)
class Held:
    """The slots one dequeued item holds until it ends (its run, or its lease's lapse)."""

    app_slot: bool = False  # one of its app's pool-wide concurrency slots
    tenant_slots: tuple[Name, ...] = ()  # its tenant's (and tenant job type's) slots

    def slots(self, zone: ZoneId) -> tuple[tuple[str, SlotName], ...]:
        """(scope, name) of each slot held, as :class:`~quickzones.consumer.slots.Slots`
        names them."""
        app: tuple[tuple[str, SlotName], ...] = ((APP_SCOPE, zone.app),) if self.app_slot else ()
        return app + tuple((SCOPE, name) for name in self.tenant_slots)


NOTHING_HELD = Held()


class Fetcher:
    """Admission and visits for one consumer's managers (or one server's pull leases)."""

    def __init__(
        self,
        config: ConsumerConfig,
        clock: Clock,
        limits: Limits | None,
        slots: Slots,
        emit: Callable[..., Any],
        *,
        registry: Registry | None = None,
        in_flight: InFlight | None = None,
        pauses: Pauses | None = None,
        weighing: Weighing | None = None,
        wake_scanner: Callable[[], None] = lambda: None,
        requeued: Callable[[tuple[str, int, str], int | None], None] = lambda key, ms: None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.limits = limits
        self.slots = slots
        self.emit = emit
        self.registry = registry  # job types' per-consumer caps (None: none apply)
        self.in_flight = in_flight  # where those caps are counted
        self.pauses = pauses  # paused apps, tenants, job types (read at most once a second)
        self.weighing = weighing or Weighing(emit)
        # Per-tenant limits; a zone held at a cap is woken when an item of it ends here.
        self.tenant_admission = TenantAdmission(limits, slots, clock, emit, wake_scanner)
        self.one_transaction = OneTransactionGate(config.one_transaction_visits, clock)
        # Where a visit left each zone's pointer: the scanner's (Scanner.requeued).
        self.visitor = ZoneVisitor(self.one_transaction, clock, emit, requeued=requeued)

    # --- a visit --------------------------------------------------------------------------

    def rules(self, **options: Any) -> VisitRules:
        """The visit's rules: the caller's ``options`` (its hooks: ``dequeued``,
        ``accept``, ``resolve``, routing, leases) with the admission rules of every path:
        the app and tenant limits, the pauses and the weights."""
        return VisitRules.of(
            self.config,
            admit=self.admit,
            paused=None if self.pauses is None else self.paused,
            weight=self.weighing.visit_rule(),
            **options,
        )

    def visit(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        rules: VisitRules,
        capacity: Callable[[], int] | None,
    ) -> None:
        """Algorithm 2 for ``visits`` (one cluster's), within ``capacity`` (Algorithm 1,
        line 5; None: each zone's room); a zone its tenant's cap held back waits for a
        wake."""
        try:
            self.visitor.visit(cluster, visits, rules, capacity)
        finally:
            for v in visits:
                if v.outcome == "requeued":
                    self.tenant_admission.requeued(cluster.toplevel, v.zone, v.tenant_hold)

    def took(self, v: ZoneVisit) -> list[Held]:
        """Settle a visit's admission once its dequeue committed: the slots and starts it
        did not use are given back, the zone's weighted turn counted; returns what each
        of ``v.items`` holds until it ends."""
        held = (
            []
            if v.tenant_hold is None
            else self.tenant_admission.settle(v.zone, v.tenant_hold, v.items)
        )
        if v.app_slots > len(v.items):
            self.slots.release(APP_SCOPE, v.zone.app, v.app_slots - len(v.items))
        self.weighing.took((v.ref.cluster, v.ref.shard, v.ref.pointer_id), v.zone, len(v.items))
        if v.app_slots <= 0 and not held:
            return [NOTHING_HELD] * len(v.items)  # the common item holds nothing
        app_slot = v.app_slots > 0
        return [Held(app_slot, slots_of(item, held) if held else ()) for item in v.items]

    def pool_slots(self, items: Sequence[WorkItem], caps: Mapping[str, int]) -> list[bool]:
        """Take one pool-wide slot of its job type for each of ``items`` whose type is in
        ``caps`` (type -> ``pool_max_concurrency``), as a local Worker does as its handler
        starts: whether each may run (an item whose type's slots are all held must be
        given back unstarted). A store that cannot be read allows none of them."""
        allowed = []
        for item in items:
            cap = caps.get(item.job_type)
            if cap is None or self.limits is None:
                allowed.append(True)
                continue
            try:
                got = self.slots.acquire(TYPE_SCOPE, item.job_type, 1, cap)
            except StorageError as err:
                self.emit("limits_error", error=str(err))
                got = 0
            if not got:
                self.emit("throttled", reason="job type concurrency cap")
            allowed.append(bool(got))
        return allowed

    # --- the rules ------------------------------------------------------------------------

    def paused(self, zone: ZoneId) -> PauseSet | None:
        """The pauses over ``zone`` (None: none kept in a store), looked up and cached
        (:mod:`quickzones.store.meta_sets`); while the store cannot be read, the last ones
        read (the error is reported, and the next visit reads again)."""
        if self.pauses is None:
            return None
        try:
            return self.pauses.of_zone(zone)
        except StorageError as err:
            self.emit("limits_error", error=str(err))
            return self.pauses.last_of(zone)

    def admit(self, zone: ZoneId, room: int, tr: KVTransaction | None) -> Admission:
        """The app's and the tenant's limits on a leased zone; inside a transaction (a
        one-transaction visit) a zone with either sends the visit to the three
        transactions (their slots and grants are taken outside any)."""
        if self.limits is None:
            return Admission(room)
        if tr is not None:
            # A native SQL visit's transaction is no KV transaction: the limits (cached)
            # are read in a transaction of their own then.
            within = None if getattr(tr, "native", False) else tr
            if self.tenant_admission.of(zone) or self.limits.get(zone.app, within).limits_dispatch:
                raise NeedsThreeTransactions
            return Admission(room)
        room, not_before, taken = self.apply_app_limits(zone, room)
        # No room when the limits cannot be read: its unused app slots are released.
        room, later, hold = self.tenant_admission.limit(zone, room)
        if later is not None:
            not_before = later if not_before is None else max(not_before, later)
        return Admission(room, not_before, taken, hold)

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
                taken = self.slots.acquire(APP_SCOPE, zone.app, room, limits.max_concurrency)
                room = taken
                if room == 0:
                    self.emit("throttled", zone=zone, reason="app concurrency cap")
            if room > 0 and limits.dispatches_per_second is not None:
                granted, window = self.limits.grant_dispatch(zone.app, room)
                if granted < room:
                    not_before = window
                    self.emit("throttled", zone=zone, reason="app dispatch rate")
                    if taken > granted:
                        self.slots.release(APP_SCOPE, zone.app, taken - granted)
                        taken = granted
                room = granted
            return room, not_before, taken
        except StorageError as err:
            self.emit("limits_error", zone=zone, error=str(err))
            return 0, None, 0

    def accept(self, reserved: dict[str, str]) -> Callable[[WorkItem], bool]:
        """Admit an item under its job type's per-consumer cap, reserving its place in
        the per-type count at once (under the lock): managers dequeue concurrently, and a
        check that counted only items already handed over let each of them fill the cap.
        ``reserved`` (item id -> job type) makes a retried dequeue attempt that sees the
        same item again reserve it once; :meth:`settle` converts or returns them."""
        flight, registry = self.in_flight, self.registry

        def accept(item: WorkItem) -> bool:
            job = None if registry is None else registry.find(item.job_type)
            if job is None or job.max_concurrency is None or flight is None:
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
        if flight is None:
            reserved.clear()
            return
        with flight.lock:
            flight.count += len(items)
            for item in items:
                if reserved.pop(item.item_id, None) is None:
                    flight.per_type[item.job_type] += 1
            for job_type in reserved.values():
                flight.per_type[job_type] -= 1
            reserved.clear()

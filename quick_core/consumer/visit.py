"""A zone visit: paper Algorithm 2, written once.

For each pointer a scan selected: lease the pointer for ``pointer_lease_s`` (about 1 s),
dequeue a bounded batch of the zone's vested items with item leases, then requeue the
pointer at the zone's minimum vesting time, or collect it when the zone has been empty
for ``min_inactive_s`` (:mod:`quickzones.store.pointer_gc`).

Those steps (:meth:`ZoneVisitor._visit_zone`) are written once and run in one of two
forms: the paper's three transactions (lease, dequeue, requeue, each committed on its
own; the zones may live in another store than the pointers), or, beyond the paper
(``one_transaction_visits``), inside one transaction of the pointers' store, for one zone
or for several selected zones at once (``visits_per_transaction``), each zone exactly as
alone (:mod:`quickzones.consumer.one_transaction_visit`). A one-transaction visit that
conflicts or meets an app with dispatch limits is written off (nothing committed) and its
zones take the three transactions.

The callers decide how much each zone may give and what becomes of its items: a
consumer's :class:`~quickzones.consumer.manager.Manager` (free workers, per-type caps,
app limits, hand-out to Workers) and the HTTP server's pull leaser (leases for remote
workers) both visit through :class:`ZoneVisitor`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.one_transaction_visit import visit_in_one_transaction
from quickzones.consumer.read_ahead import VisitReadAhead
from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.consumer.visit_rules import (
    Admission,
    Hold,
    Key,
    VisitRules,
    ZoneVisit,
    ZoneVisitsFailed,
    visit_key,
)
from quickzones.errors import StorageError, StoreLost, ZoneLeaseFailed
from quickzones.store.kv import KVTransaction
from quickzones.store.toplevel import PointerRef
from quickzones.store.zones.budget import TransactionBudget
from quickzones.store.zones.dequeue import Left


class ZoneVisitor:
    """Algorithm 2 for one consumer's managers (or one server's pull leases), which share
    its :class:`OneTransactionGate`."""

    def __init__(
        self,
        gate: OneTransactionGate,
        clock: Clock,
        emit: Callable[..., Any],
        *,
        budget: Callable[[], TransactionBudget] = TransactionBudget,
        requeued: Callable[[Key, int | None], None] = lambda key, vests_ms: None,
    ) -> None:
        self.gate = gate
        self.clock = clock
        self.emit = emit
        # Told, once a visit committed, when each zone's pointer vests next (None:
        # collected): the scanner need not peek for it before then.
        self.requeued = requeued
        # A fresh budget for each try of a visit transaction (quickzones.store.zones.budget).
        self.budget = budget
        self.read_ahead = VisitReadAhead()

    def visit(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        rules: VisitRules,
        capacity: Callable[[], int] | None = None,
    ) -> None:
        """Visit ``visits``' zones of ``cluster``: all in one transaction where the zones
        live in the pointers' store and the gate allows it; else, or when that one is
        written off, one at a time. ``capacity``: how many items they may take in all (a
        zone there is no room left for is not leased); None: each its ``room``.

        A pointer that cannot be leased (gone, moved, leased by another consumer, another
        app's) is skipped. A zone whose visit fails with a storage error fails alone: a
        batch that fails is written off and each of its zones visited on its own, and
        once the others are done :class:`ZoneVisitsFailed` names the zones that failed
        (the scanner sets each aside on its own backoff); their pointers vest again."""
        failed = self._visit(cluster, visits, rules, capacity)
        if failed:
            raise ZoneVisitsFailed(failed, len(visits))

    def _visit(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        rules: VisitRules,
        capacity: Callable[[], int] | None,
    ) -> list[tuple[PointerRef, StorageError]]:
        """:meth:`visit`; returns the zones that failed, each with its error."""
        if capacity is not None and capacity() <= 0:
            return []
        if not cluster.zones.capabilities.lookahead_dequeue:
            rules = replace(rules, horizon_ms=0)
        if cluster.zones.capabilities.one_transaction_visits:
            alone = [v for v in visits if self.gate.alone(visit_key(v.ref))]
            if alone and len(visits) > 1:
                # Zones that conflicted lately go last, each alone (three transactions
                # while held): their next conflicts write off no other zone's visit.
                rest = [v for v in visits if all(v is not a for a in alone)]
                failed = self._visit(cluster, rest, rules, capacity) if rest else []
                for v in alone:
                    failed += self._visit(cluster, [v], rules, capacity)
                return failed
            if all(self.gate.try_one(visit_key(v.ref)) for v in visits):  # none is held
                try:
                    if visit_in_one_transaction(self, cluster, visits, rules, capacity):
                        return []
                except StoreLost:
                    raise
                except StorageError as err:
                    if len(visits) == 1:
                        return [(visits[0].ref, err)]
                    # One zone's failure (a record it cannot read, a store error of its
                    # own) wrote the whole batch off: the others must not fail with it.
                if len(visits) > 1:  # each zone as a visit of its own
                    return [f for v in visits for f in self._visit(cluster, [v], rules, capacity)]
        return self._visit_apart(cluster, visits, rules, capacity)

    def _visit_apart(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        rules: VisitRules,
        capacity: Callable[[], int] | None,
    ) -> list[tuple[PointerRef, StorageError]]:
        """The paper's three transactions for each zone in turn; returns those that failed."""
        failed: list[tuple[PointerRef, StorageError]] = []
        for v in visits:
            free = None if capacity is None else capacity()
            room = v.room if free is None else min(v.room, free)
            if room <= 0:
                break
            starting = None if rules.start_now is None else rules.start_now()
            try:
                self.visit_zone(cluster, v, room, rules, None, self.budget(), free, starting)
            except ZoneLeaseFailed as err:
                self.emit("pointer_lease_failed", reason=err.reason)
            except StoreLost:
                raise
            except StorageError as err:
                failed.append((v.ref, err))
            else:
                if v.error is not None:
                    failed.append((v.ref, v.error))
        return failed

    def tell(self, v: ZoneVisit) -> None:
        """Tell :attr:`requeued` where ``v``'s committed requeue left its pointer."""
        if v.outcome == "requeued" and v.vests_ms is not None:
            self.requeued(visit_key(v.ref), v.vests_ms)
        elif v.outcome == "deleted":
            self.requeued(visit_key(v.ref), None)

    def visit_zone(
        self,
        cluster: Cluster,
        v: ZoneVisit,
        room: int,
        rules: VisitRules,
        tr: KVTransaction | None,
        budget: TransactionBudget,
        free: int | None = None,
        starting: int | None = None,
        *,
        taking: Callable[[int], None] | None = None,
    ) -> None:
        """Lease ``v``'s pointer, dequeue up to ``room`` items (a weighted zone: its
        weight times ``v.room``, at most ``free``; at most what ``budget`` leaves the
        transaction), requeue or collect the pointer: inside ``tr``, or (None) each step
        in its own transaction. Raises
        ZoneLeaseFailed (nothing written); inside ``tr``, also the errors that write the
        transaction off. ``starting``: how many of its items start at once (the rest are
        leased held); None: all. ``taking``: told how many it leases, where its store
        can tell before its writes (dequeue.Left.taking)."""
        top, zones = cluster.toplevel, cluster.zones
        ahead: dict[str, Any] = {"horizon_ms": rules.horizon_ms} if rules.horizon_ms else {}
        inside: dict[str, Any] = {} if tr is None else {"tr": tr}
        # The KV zone stores (those that join a visit's transaction) bound a dequeue by
        # the transaction's budget; another store's dequeue is its own.
        # They also say what the dequeue left (dequeue.Left): the requeue's next vesting
        # time when a vested item is left, without a second read of the zone's order.
        left = Left(taking=taking)
        bounded: dict[str, Any] = (
            {"budget": budget, "left": left} if zones.capabilities.one_transaction_visits else {}
        )
        if tr is None:
            v.pointer = top.obtain_pointer_lease(
                v.ref,
                rules.pointer_lease_ms,
                accept=rules.accept_pointer,
                holder=cluster.holder,
                **ahead,
            )
            self.emit("pointer_leased", zone=v.zone, lag_ms=self.lag_ms(v.ref))
        else:
            # Written once, by the requeue below, in the same transaction.
            stored, v.pointer = top.lease_pointer(
                v.ref,
                rules.pointer_lease_ms,
                accept=rules.accept_pointer,
                holder=cluster.holder,
                tr=tr,
                **ahead,
            )
            v.stored = (v.ref.shard, stored)
            self.read_ahead.leased(v.ref, v.pointer.zone)
        zone = v.zone
        if rules.weight is not None:
            room = rules.weight(v.ref, zone, v.room, free)
        hold = Hold.of(rules.paused, zone, self.clock)
        if hold.zone_paused:
            admitted = Admission(0, hold.recheck_ms)  # before the app's limits: none taken
            self.emit("throttled", zone=zone, reason="paused")
        else:
            admitted = Admission(room) if rules.admit is None else rules.admit(zone, room, tr)
        v.app_slots = admitted.app_slots
        v.tenant_hold = limited = admitted.tenant_hold
        if admitted.room > 0:
            accept = hold.accept(None if rules.accept is None else rules.accept(v.reserved))
            if limited is not None:
                accept = limited.accept(accept)  # a limited job type's room
            # Told only when some of its items wait: a store need not know it otherwise.
            waits = {} if starting is None or starting >= admitted.room else {"start_now": starting}
            try:
                # Inside ``tr`` only where the store can join it (one_transaction_visits).
                v.items, v.corrupt = zones.dequeue(
                    zone,
                    admitted.room,
                    rules.item_lease_ms,
                    accept=accept,
                    resolve=rules.resolve,
                    **inside,
                    **ahead,
                    **waits,
                    **bounded,
                )
                v.cut_short = budget.reached and len(v.items) < admitted.room
            except StorageError as err:
                if tr is not None:
                    raise
                self.emit("dequeue_error", zone=zone, error=str(err))
                v.error = err
                left.vested_ms = None  # a try that did not commit: the zone is read
        if tr is None:
            if v.cut_short:
                self.emit("visit_budget_reached", zone=zone, items=len(v.items))
            rules.dequeued(v)
        not_before = admitted.not_before_ms
        if hold.held_back and len(v.items) < admitted.room:
            # Only paused items were left: look again when a resume can have been read,
            # not at once (their vesting time is now, and they would be visited in a loop).
            not_before = max(not_before or 0, hold.recheck_ms)
        if limited is not None:  # a job type or the tenant at its limit
            not_before = limited.not_before(
                not_before, len(v.items), admitted.room, rules.horizon_ms
            )

        def min_vesting(t: KVTransaction) -> int | None:
            # A vested item left: the pointer vests now whatever the zone's exact earliest
            # time (the requeue never vests it before now), and no later enqueue can need
            # it sooner, so no read, and no read conflict, is needed (paper Algorithm 2's
            # requeue, from what the dequeue read in this visit).
            # The same where the dequeue's read told the zone's next vesting time.
            earliest = left.earliest(lambda: zones.min_vesting_ms(zone, tr=t))
            if earliest is None or not_before is None:
                return earliest
            return max(earliest, not_before)  # a rate-limited app waits for its next window

        try:
            v.outcome = top.requeue_pointer(
                v.pointer,
                min_vesting,
                lambda t: zones.zone_is_empty(t, zone),
                min_inactive_ms=rules.min_inactive_ms,
                active=bool(v.items),
                stored=v.stored,
                vests=lambda ms: setattr(v, "vests_ms", ms),
                **inside,
            )
        except StorageError as err:
            if tr is not None:
                raise
            # The pointer lease simply expires and the pointer vests again.
            self.emit("pointer_requeue_error", zone=zone, error=str(err))
            return
        if tr is None:
            self.emit("pointer_" + v.outcome, zone=zone)
            self.tell(v)

    def lag_ms(self, ref: PointerRef) -> int:
        """How long the pointer had been vested when leased (0 if leased ahead)."""
        return max(0, now_ms(self.clock) - ref.vesting_ms)

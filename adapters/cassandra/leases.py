"""Item leases of Cassandra zones by vesting time: obtain, dequeue (peek and lease in one
conditional batch), extend, requeue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quickzones.adapters.cassandra.dead_letters import DeadLetters
from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.plans import Plan
from quickzones.adapters.cassandra.reads import ZoneReads
from quickzones.clock import now_ms, vesting_after
from quickzones.errors import CorruptRecord, InvalidArgument, ItemNotFound, ItemNotVested
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zones import new_lease_id
from quickzones.store.zonestore import CorruptItem


class ItemLeases(ZoneReads, DeadLetters):
    """Leases on items: a lease moves the item's vesting time ahead with a fresh lease id."""

    def _lease_plan(
        self, zone: ZoneId, item: WorkItem, now: int, lease_ms: int, *, held: bool = False
    ) -> Plan:
        # As ZoneLeases._grant_lease: a lease to start at once counts a run; a held one
        # (leased to wait) counts it at its start. A started run whose lease lapsed
        # unreleased (its consumer crashed or stalled) has its count taken over by the
        # next run; a held lease that lapsed counted nothing. Lapses themselves are not
        # stored in the Cassandra table.
        lapsed_run = item.lease_id is not None and not item.held
        attempts = item.attempts - (1 if lapsed_run else 0) + (0 if held else 1)
        leased = item.with_(
            vesting_ms=now + lease_ms,
            lease_id=new_lease_id(self.ids),
            attempts=max(0, attempts),
            held=held,
            vested_ms=item.vesting_ms,  # for its pickup figure (not stored)
        )
        return self._plan_update(zone, item, leased)

    def start(self, zone: ZoneId, item_id: str, lease_id: str) -> WorkItem:
        """A Worker's check before it starts an item that waited for it: a read where the
        run was counted when the lease was granted; a held lease is turned into a started
        one, its run counted (a conditional write)."""
        item = self._check_holder(self.get(zone, item_id), item_id, lease_id)
        if not item.held:
            return item

        def decide(current: WorkItem | None) -> Plan:
            held = self._check_holder(current, item_id, lease_id)
            if not held.held:
                return self._plan_update(zone, held, held)  # started meanwhile: as it is
            return self._plan_update(zone, held, held.with_(attempts=held.attempts + 1, held=False))

        started = self._apply(zone, item_id, decide, first=item)
        assert started is not None
        return started

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem:
        _check_duration(lease_ms)

        def decide(item: WorkItem | None) -> Plan:
            if item is None:
                raise ItemNotFound(item_id)
            now = now_ms(self.clock)
            if item.vesting_ms > now:
                raise ItemNotVested(item_id, item.vesting_ms)
            return self._lease_plan(zone, item, now, lease_ms)

        leased = self._apply(zone, item_id, decide)
        assert leased is not None
        return leased

    def _dequeue_plan(
        self,
        zone: ZoneId,
        item: WorkItem,
        now: int,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        held: bool = False,
    ) -> tuple[Plan | None, str]:
        """What a dequeue does to one vested item: ("lease" | "at_most_once" | "expired" |
        "skip", plan)."""
        if resolve is not None:
            item = resolve(item)
        if item.vesting_ms > now:
            return None, "skip"
        if item.deadline_ms is not None and now > item.deadline_ms:
            return self._plan_delete(zone, item, "expired: not started before its TTL"), "expired"
        if accept is not None and not accept(item):
            return None, "skip"
        # At-most-once items are leased too: the consumer deletes one when its handler
        # starts, so one taken but never started is given back, not lost.
        return self._lease_plan(zone, item, now, lease_ms, held=held), "lease"

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        start_now: int | None = None,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease in one conditional batch (one Paxos round for the whole visit).

        If the batch is refused (another consumer changed an item) each item is retried on
        its own. Expired and corrupt items are dead-lettered on the way, so neither
        blocks the zone. ``start_now``: as the KV zones' dequeue, leases beyond the first
        this many are held (their runs counted at their start checks).
        """
        _check_duration(lease_ms)
        now = now_ms(self.clock)
        entries = self._vested_entries(zone, max_items, now)
        rows = self._read_many(zone, [e[2] for e in entries])
        z = (zone.app, zone.tenant)
        plans: list[tuple[Plan, str, bool]] = []
        starting = max_items if start_now is None else start_now
        corrupt: list[CorruptItem] = []
        repairs: list[tuple[Any, tuple[Any, ...]]] = []
        for priority, vesting, item_id in entries:
            row = rows.get(item_id)
            if row is None:
                # An order entry without its item (completed between the two reads, or a
                # resurrected entry): deleting it is harmless either way.
                repairs.append((self.table.del_order, (*z, priority, vesting, item_id)))
                continue
            try:
                item = self.table.to_item(zone, row)
            except CorruptRecord as err:
                self._drop_row(zone, row, err.reason)
                corrupt.append(CorruptItem(item_id, err.reason))
                continue
            if item.vesting_ms != vesting:
                continue  # moved since the index read; its current entry is elsewhere
            held = starting <= 0
            plan, kind = self._dequeue_plan(zone, item, now, lease_ms, accept, resolve, held)
            if plan is not None:
                plans.append((plan, kind, held))
                if kind == "lease" and not held:
                    starting -= 1
        if repairs:
            try:
                self.table.write(repairs)
            except CassandraError:
                pass  # the next visit repairs them
        if not plans:
            return [], corrupt
        outcome = self.table.cas([s for plan, _, _ in plans for s in plan.statements])
        taken: list[WorkItem] = []
        for plan, kind, held in plans:
            if outcome:
                result: WorkItem | None = plan.result
                done = True
            else:
                result, done = self._dequeue_one(zone, plan, kind, lease_ms, accept, resolve, held)
            if not done:
                continue
            if kind == "lease" and result is not None:
                taken.append(result)
            elif kind == "at_most_once":
                taken.append(
                    plan.item.with_(
                        lease_id=new_lease_id(self.ids), attempts=plan.item.attempts + 1
                    )
                )
        return taken, corrupt

    def _dequeue_one(
        self,
        zone: ZoneId,
        plan: Plan,
        kind: str,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        held: bool = False,
    ) -> tuple[WorkItem | None, bool]:
        """Retry one item of a refused (or unknown) batch. Returns (result, taken)."""
        item_id = plan.item.item_id
        try:
            current = self.table.read_one(zone, item_id, serial=True)
        except CassandraError:
            return None, False  # a lease we may hold expires on its own
        if kind in ("lease", "expired") and plan.applied(current):
            return plan.result, True  # the batch was applied after all
        if kind == "at_most_once" and current is None:
            # Gone: maybe our delete, maybe another consumer's. Not knowing, do not run it:
            # at-most-once allows not running, never running twice.
            return None, False
        chosen: list[str] = []

        def decide(item: WorkItem | None) -> Plan | None:
            if item is None:
                return None
            new_plan, new_kind = self._dequeue_plan(
                zone, item, now_ms(self.clock), lease_ms, accept, resolve, held
            )
            chosen[:] = [new_kind]
            return new_plan

        try:
            result = self._apply(zone, item_id, decide, first=current)
        except CassandraError:
            return None, False
        if not chosen or chosen[0] in ("skip", "expired"):
            return None, False
        return result, chosen[0] == "lease"

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since."""
        _check_duration(lease_ms)

        def decide(item: WorkItem | None) -> Plan:
            held = self._check_holder(item, item_id, lease_id)
            return self._plan_update(
                zone, held, held.with_(vesting_ms=now_ms(self.clock) + lease_ms)
            )

        result = self._apply(zone, item_id, decide)
        assert result is not None
        return result

    def requeue(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        delay_ms: int,
        *,
        error: str | None = None,
        count_error: bool = True,
        meta: dict[str, object] | None = None,
        not_before_ms: int | None = None,
        ran: bool = True,
    ) -> WorkItem:
        def decide(item: WorkItem | None) -> Plan:
            held = self._check_holder(item, item_id, lease_id)
            return self._plan_update(
                zone,
                held,
                held.with_(
                    vesting_ms=max(vesting_after(self.clock, delay_ms), not_before_ms or 0),
                    lease_id=None,
                    held=False,
                    # A held lease counted no run: nothing to take back.
                    attempts=held.attempts if ran or held.held else max(0, held.attempts - 1),
                    error_count=held.error_count + (1 if count_error else 0),
                    last_error=error if error is not None else held.last_error,
                    meta={**held.meta, **meta} if meta else held.meta,
                ),
            )

        result = self._apply(zone, item_id, decide)
        assert result is not None
        return result


def _check_duration(lease_ms: int) -> None:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
        raise InvalidArgument("lease duration", lease_ms, "must be a positive number of ms")

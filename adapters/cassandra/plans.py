"""One item's conditional change in Cassandra zones, and the loop that runs it.

Every change to an item is a lightweight transaction: a conditional batch on the item row
``IF lease_id = ? AND vesting_ms = ?`` (the state the caller read) that also moves the
item's order entry. A refused or unknown outcome is settled by a SERIAL re-read, never
guessed (see :mod:`quickzones.adapters.cassandra.store`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.table import ZoneTable
from quickzones.clock import Clock, now_ms
from quickzones.errors import ItemNotFound, LeaseLost
from quickzones.store.ids import IdSource
from quickzones.store.kv import KVStore
from quickzones.store.records import MAX_TRACEBACK, WorkItem, ZoneId
from quickzones.store.toplevel import TopLevelQueue

# A conditional write refused this many times in a row (contention) is reported, not looped.
CAS_ATTEMPTS = 8
# Where a dead row keeps its failure's traceback (the table has no column for it).
TRACEBACK_META = "_traceback"


@dataclass(frozen=True, slots=True)
class Plan:
    """One item's conditional change: the statements to run and how to recognise, on a
    SERIAL re-read, that they were applied (for writes whose outcome is unknown)."""

    item: WorkItem  # as read: the condition
    statements: list[tuple[Any, tuple[Any, ...]]]
    result: WorkItem | None  # the new row; None when the item is deleted

    def applied(self, row: WorkItem | None) -> bool:
        if self.result is None:
            return row is None
        return (
            row is not None
            and row.lease_id == self.result.lease_id
            and row.vesting_ms == self.result.vesting_ms
        )


class ConditionalWrites:
    """Plans of one item's change and the conditional write that applies them; the base
    of :class:`~quickzones.adapters.cassandra.store.CassandraZoneStore`'s parts."""

    # Set by the store's constructor (quickzones.adapters.cassandra.store).
    table: ZoneTable
    kv: KVStore
    toplevel: TopLevelQueue
    clock: Clock
    ids: IdSource

    def _cond(self, item: WorkItem) -> tuple[str, int]:
        return (item.lease_id or "", item.vesting_ms)

    def _plan_update(self, zone: ZoneId, old: WorkItem, new: WorkItem) -> Plan:
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (
                self.table.upd_item_if,
                (
                    new.vesting_ms,
                    new.lease_id or "",
                    new.attempts,
                    new.error_count,
                    new.last_error,
                    self.table.fields(new)[-1],
                    *z,
                    old.item_id,
                    *self._cond(old),
                ),
            )
        ]
        if (old.priority, old.vesting_ms) != (new.priority, new.vesting_ms):
            statements.append(
                (self.table.del_order, (*z, old.priority, old.vesting_ms, old.item_id))
            )
            statements.append(
                (self.table.ins_order, (*z, new.priority, new.vesting_ms, new.item_id))
            )
        return Plan(old, statements, new)

    def _plan_delete(
        self,
        zone: ZoneId,
        old: WorkItem,
        dead_reason: str | None = None,
        *,
        count_error: bool = False,
        traceback: str | None = None,
    ) -> Plan:
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (self.table.del_item_if, (*z, old.item_id, *self._cond(old))),
            (self.table.del_order, (*z, old.priority, old.vesting_ms, old.item_id)),
        ]
        if dead_reason is not None:
            kept = old.with_(lease_id=None)
            if count_error:
                kept = kept.with_(error_count=old.error_count + 1, last_error=dead_reason)
            if traceback is not None:
                # The row has no traceback column: it rides in the dead row's metadata
                # (no schema change) and dead_letters() takes it out again.
                kept = kept.with_(meta={**kept.meta, TRACEBACK_META: traceback[-MAX_TRACEBACK:]})
            statements.append(
                (
                    self.table.ins_dead,
                    (
                        *z,
                        old.item_id,
                        *self.table.fields(kept),
                        dead_reason[:2000],
                        now_ms(self.clock),
                    ),
                )
            )
        return Plan(old, statements, None)

    def _apply(
        self,
        zone: ZoneId,
        item_id: str,
        decide: Callable[[WorkItem | None], Plan | None],
        *,
        first: WorkItem | None = None,
        fresh: bool = False,
    ) -> WorkItem | None:
        """Read the item, let ``decide`` plan a change (or raise), run it conditionally;
        on refusal re-read at SERIAL and decide again. Returns the plan's new row (None
        for a delete, or when ``decide`` planned nothing)."""
        item = first
        read = first is not None
        for attempt in range(CAS_ATTEMPTS):
            if not read:
                item = self.table.read_one(zone, item_id, serial=attempt > 0 or fresh)
            read = False
            plan = decide(item)
            if plan is None:
                return None
            outcome = self.table.cas(plan.statements)
            if outcome is None:
                current = self.table.read_one(zone, item_id, serial=True)
                if plan.applied(current):
                    return plan.result
                # Not applied: the refused or lost write changed nothing; decide again.
                item, read = current, True
                continue
            if outcome:
                return plan.result
        raise CassandraError(f"item {item_id!r}: {CAS_ATTEMPTS} conditional writes refused")

    def _check_holder(self, item: WorkItem | None, item_id: str, lease_id: str) -> WorkItem:
        if item is None:
            raise ItemNotFound(item_id)
        if item.lease_id != lease_id:
            raise LeaseLost(item_id)
        return item

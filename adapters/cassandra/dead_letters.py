"""Dead letters of Cassandra zones: rows of kind 2 in the zone's own partition, so moving
an item there is one conditional batch."""

from __future__ import annotations

import logging
from typing import Any

from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.plans import TRACEBACK_META, ConditionalWrites, Plan
from quickzones.adapters.cassandra.schema import ITEM_COLUMNS
from quickzones.clock import now_ms
from quickzones.errors import CorruptRecord, ItemNotFound, LeaseLost
from quickzones.store.records import DeadLetter, WorkItem, ZoneId, encode_item

log = logging.getLogger("quick.cassandra")


class DeadLetters(ConditionalWrites):
    """Dead-lettering items and corrupt rows; listing and purging dead letters."""

    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
    ) -> None:
        """Move the item to the zone's dead letters (rows of kind 2 in the same partition,
        so the move is one conditional batch). With ``lease_id`` the holder's failed run
        counts as an error, as in the KV zone store."""

        def decide(item: WorkItem | None) -> Plan:
            if item is None:
                raise ItemNotFound(item_id)
            if lease_id is not None and item.lease_id != lease_id:
                raise LeaseLost(item_id)
            return self._plan_delete(
                zone, item, reason, count_error=lease_id is not None, traceback=traceback
            )

        self._apply(zone, item_id, decide)

    def _drop_row(self, zone: ZoneId, row: Any, reason: str) -> None:
        """Dead-letter an undecodable item row with whatever fields it has, and delete it
        with its order entry."""
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (self.table.del_item, (*z, row.item_id)),
            (
                self.table.ins_dead,
                (
                    *z,
                    row.item_id,
                    *(getattr(row, c) for c in ITEM_COLUMNS),
                    reason,
                    now_ms(self.clock),
                ),
            ),
        ]
        if row.priority is not None and row.vesting_ms is not None:
            statements.append(
                (self.table.del_order, (*z, row.priority, row.vesting_ms, row.item_id))
            )
        try:
            self.table.write(statements)
        except CassandraError as err:
            log.warning("could not dead-letter corrupt item %s in %s: %s", row.item_id, zone, err)

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        rows = self.table.read(self.table.sel_item, (zone.app, zone.tenant, item_id))
        if rows:
            self._drop_row(zone, rows[0], "corrupt record")

    def dead_letters(self, zone: ZoneId) -> list[DeadLetter]:
        out = []
        for row in self.table.read(self.table.sel_dead, (zone.app, zone.tenant)):
            try:
                item: WorkItem | None = self.table.to_item(zone, row)
            except CorruptRecord:
                item = None
            tb: str | None = None
            if item is not None and TRACEBACK_META in item.meta:
                meta = dict(item.meta)
                tb = str(meta.pop(TRACEBACK_META))
                item = item.with_(meta=meta)
            raw = encode_item(item) if item is not None else b""
            out.append(
                DeadLetter(
                    zone, row.item_id, row.dead_reason or "", row.dead_at_ms or 0, item, raw, tb
                )
            )
        return out

    def purge_dead_letter(self, zone: ZoneId, item_id: str) -> None:
        self.table.write([(self.table.del_dead, (zone.app, zone.tenant, item_id))])

"""What a Cassandra zone holds: vested items in order, one item, counts, every zone and
every item (reads only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from quickzones.adapters.cassandra.plans import ConditionalWrites
from quickzones.clock import now_ms
from quickzones.errors import CorruptRecord
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.validation import MIN_PRIORITY
from quickzones.store.zonestore import CorruptItem


class ZoneReads(ConditionalWrites):
    """The reads of Cassandra zones."""

    def _vested_entries(self, zone: ZoneId, max_items: int, now: int) -> list[tuple[int, int, str]]:
        """(priority, vesting, item_id) of up to ``max_items`` vested order entries, in
        order: per priority present, one read finds it and one reads its vested entries."""
        z = (zone.app, zone.tenant)
        out: list[tuple[int, int, str]] = []
        cursor = MIN_PRIORITY
        while len(out) < max_items:
            first = self.table.read(self.table.sel_next_priority, (*z, cursor))
            if not first:
                break
            priority = first[0].o_priority
            rows = self.table.read(self.table.sel_vested, (*z, priority, now, max_items - len(out)))
            out.extend((r.o_priority, r.o_vesting, r.item_id) for r in rows)
            cursor = priority + 1
        return out

    def _read_many(self, zone: ZoneId, ids: list[str]) -> dict[str, Any]:
        if not ids:
            return {}
        rows = self.table.read(self.table.sel_items, (zone.app, zone.tenant, ids))
        return {r.item_id: r for r in rows}

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        now = now_ms(self.clock)
        entries = self._vested_entries(zone, max_items, now)
        rows = self._read_many(zone, [e[2] for e in entries])
        out = []
        for _, vesting, item_id in entries:
            row = rows.get(item_id)
            if row is None:
                continue
            try:
                item = self.table.to_item(zone, row)
            except CorruptRecord:
                continue
            if item.vesting_ms == vesting:
                out.append(item)
        return out

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None:
        return self.table.read_one(zone, item_id, serial=False)

    def count(self, zone: ZoneId) -> int:
        rows = self.table.read(self.table.sel_count, (zone.app, zone.tenant))
        return int(rows[0][0]) if rows else 0

    def counts(self, zones: list[ZoneId]) -> list[int]:
        # One partition a zone: a read each (Cassandra has no snapshot across them).
        return [self.count(zone) for zone in zones]

    def zones(self, page_size: int = 500) -> Iterator[ZoneId]:
        """Every zone (partition) with rows, in token order, read page by page."""
        for row in self.table.pages(self.table.sel_zones, (), page_size, "zone listing"):
            yield ZoneId(row.app, row.tenant)

    def items(self, zone: ZoneId, page_size: int = 500) -> Iterator[WorkItem | CorruptItem]:
        """Every item of a zone (leased or not), page by page, in id order."""
        params = (zone.app, zone.tenant)
        for row in self.table.pages(self.table.sel_zone_items, params, page_size, "item listing"):
            try:
                yield self.table.to_item(zone, row)
            except CorruptRecord as err:
                yield CorruptItem(row.item_id, err.reason)

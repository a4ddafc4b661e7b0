"""Reading a zone: its vested items in order (peek), one item, its earliest vesting time
(read with the conflicts a pointer requeue needs), whether it is empty (pointer GC) and its
count."""

from __future__ import annotations

from quickzones.clock import now_ms
from quickzones.errors import (
    CorruptRecord,
)
from quickzones.store import sharded_counts
from quickzones.store.kv import (
    OWN_STORE,
    KVTransaction,
    run,
    transactional,
)
from quickzones.store.records import (
    WorkItem,
    ZoneId,
)
from quickzones.store.zones.items import ZoneItems


class ZoneReads(ZoneItems):
    def _vested_entries(
        self, tr: KVTransaction, zone: ZoneId, max_items: int, now: int, *, snapshot: bool
    ) -> list[tuple[bytes, str, int | None]]:
        """(order key, item_id, vesting: None for a FIFO entry) of up to ``max_items``
        vested items, in order: each key unpacked once, here (the dequeue sorts by the
        vesting without unpacking again).

        The default priority, 0, first: one read takes its vested vesting-keyed entries
        (with every entry of a priority below it, if any, to tell whether there are some),
        which in a zone of one priority is the whole dequeue when they fill it. Then, or
        from the start when some priority below 0 is in use, per priority: one short read
        finds it, one range read takes its vested vesting-keyed entries and, if there is
        room, one more its FIFO entries. The cost is proportional to what is returned plus
        the priorities present.
        """
        if max_items <= 0:
            return []
        begin, end = self.keys.order_range(zone)
        default_vested_end = self.keys.order_priority_range(zone, 0, now)[1]
        rows = tr.get_range(begin, default_vested_end, limit=max_items, snapshot=snapshot)
        out: list[tuple[bytes, str, int | None]] = []
        cursor = self.keys.fifo_range(zone, 0)[0]  # after priority 0's vested entries
        for k, _ in rows:
            priority, at, item_id = self.keys.unpack_order_key(zone, k)
            if priority != 0:  # a priority below the default is in use: read in order
                out, cursor = [], begin
                break
            out.append((k, item_id, at))
        while len(out) < max_items:
            first = tr.get_range(cursor, end, limit=1, snapshot=snapshot)
            if not first:
                break
            priority, vesting, _ = self.keys.unpack_order_key(zone, first[0][0])
            ranges = [self.keys.fifo_range(zone, priority)]
            if vesting is not None:  # FIFO entries sort last: this priority has both kinds
                ranges.insert(0, self.keys.order_priority_range(zone, priority, now))
            for rbegin, rend in ranges:
                if len(out) >= max_items:
                    break
                rows = tr.get_range(rbegin, rend, limit=max_items - len(out), snapshot=snapshot)
                for k, _ in rows:
                    _, at, item_id = self.keys.unpack_order_key(zone, k)
                    out.append((k, item_id, at))
            # Skip the rest of this priority (not vested) in one hop.
            cursor = self.keys.order_priority_start(zone, priority + 1)
        return out

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        def read(tr: KVTransaction) -> list[WorkItem]:
            now = now_ms(self.clock)
            items = []
            for _, item_id, _ in self._vested_entries(tr, zone, max_items, now, snapshot=True):
                try:
                    item = self._read_item(tr, zone, item_id, snapshot=True)
                except CorruptRecord:
                    continue
                if item is not None:
                    items.append(item)
            return items

        return run(self.kv, read)

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None:
        return run(self.kv, lambda tr: self._read_item(tr, zone, item_id, snapshot=True))

    @transactional
    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction = OWN_STORE) -> int | None:
        """The zone's earliest vesting time, or None if it is empty; read with conflicts, so
        inside a pointer requeue's ``tr`` it conflicts with an enqueue committing later.

        Reads the first entry of each priority, and of its FIFO entries (vested since
        their enqueue, whose time their record holds): a requeue at this time sees every
        item, and conflicts with a later commit that writes an entry vesting before that
        time (an enqueue, a nack). Not with one that only touches entries vesting at or
        after it, in a priority that has entries: those are the zone's leased items, and a
        completion clearing one (the consumer's own workers, all the time in a busy zone)
        at most leaves the pointer vesting early, which a visit corrects.
        """
        begin, end = self.keys.order_range(zone)
        best: int | None = None
        priorities: list[int] = []
        cursor = begin
        while True:
            first = tr.get_range(cursor, end, limit=1, snapshot=True)
            if not first:
                self._conflict_below(tr, zone, priorities, best)
                return best
            priority, vesting, item_id = self.keys.unpack_order_key(zone, first[0][0])
            if not priorities or priorities[-1] != priority:
                priorities.append(priority)
            if vesting is None:
                vesting = self._fifo_vesting(tr, zone, item_id)
                cursor = self.keys.order_priority_start(zone, priority + 1)
            else:
                # The next read lands on this priority's first FIFO entry, if any, or else
                # on the next priority: no extra read for zones without FIFO items.
                cursor = self.keys.fifo_range(zone, priority)[0]
            best = vesting if best is None else min(best, vesting)

    def _conflict_below(
        self, tr: KVTransaction, zone: ZoneId, priorities: list[int], best: int | None
    ) -> None:
        """Read conflicts over the whole order index except, in each priority present, the
        entries keyed by a vesting time at or after ``best`` (see :meth:`min_vesting_ms`).
        FIFO entries (vested at their enqueue) and priorities not present stay covered."""
        begin, end = self.keys.order_range(zone)
        cursor = begin
        if best is not None:
            for priority in priorities:
                hole = self.keys.order_priority_range(zone, priority, best - 1)[1]
                tr.add_read_conflict_range(cursor, hole)
                cursor = self.keys.fifo_range(zone, priority)[0]
        tr.add_read_conflict_range(cursor, end)

    def _fifo_vesting(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> int:
        try:
            item = self._read_item(tr, zone, item_id, snapshot=True)
        except CorruptRecord:
            item = None
        # Without a readable record the entry is vested now: dequeue repairs or
        # dead-letters it on the next visit.
        return 0 if item is None else item.vesting_ms

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        """Reads the whole zone range in ``tr`` (invariant 2).

        Called only by the transaction that deletes the zone's pointer: when the zone is
        empty it also clears the zone's zero count (every shard of it,
        ``sharded_counts``), so a collected tenant leaves no key behind (a million idle
        tenants cost nothing). One read: past the count's keys (at most
        ``sharded_counts.SHARDS``) the next row, if any, is an item's.
        """
        begin, end = self.keys.zone_range(zone)
        counts_begin, counts_end = sharded_counts.key_range(self.keys.count_key(zone))
        rows = tr.get_range(begin, end, limit=sharded_counts.SHARDS + 1)
        empty = all(counts_begin <= k < counts_end for k, _ in rows)
        if empty and rows:
            tr.clear_range(counts_begin, counts_end)
        return empty

    def count(self, zone: ZoneId) -> int:
        return run(self.kv, lambda tr: sharded_counts.read(tr, self.keys.count_key(zone)))

    def counts(self, zones: list[ZoneId]) -> list[int]:
        """The counts of ``zones``, in one snapshot transaction (a metrics scrape reads a
        chunk of zones at once, not one transaction a zone)."""
        keys = [self.keys.count_key(zone) for zone in zones]
        return run(self.kv, lambda tr: [sharded_counts.read(tr, key) for key in keys])

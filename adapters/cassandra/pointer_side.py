"""The reads the top-level queue's pointer transactions make of a Cassandra zone: its
earliest vesting time for a pointer requeue, and the strong emptiness check before a
pointer is collected, each ordered by the KV transaction's read version."""

from __future__ import annotations

from quickzones.adapters.cassandra.plans import ConditionalWrites
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.validation import MIN_PRIORITY


class PointerSide(ConditionalWrites):
    """``min_vesting_ms`` and ``zone_is_empty`` of Cassandra zones."""

    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction | None = None) -> int | None:
        """The zone's earliest vesting time from Cassandra, or None if it is empty.

        With ``tr`` (a pointer requeue's transaction) the read is ordered by it: ``tr``'s
        read version is fixed first and the pointer index key joins its read conflict set.
        An enqueue whose pointer transaction commits after this read version declared a
        write conflict on that key, so the requeue aborts and retries, and its retry reads
        Cassandra after that item was written. Without it the pointer could be requeued at
        a later time than the new item's.
        """
        if tr is not None:
            tr.get_read_version()
            for key in self.toplevel.index_keys(zone):
                tr.add_read_conflict_key(key)
        z = (zone.app, zone.tenant)
        best: int | None = None
        cursor = MIN_PRIORITY
        while True:
            first = self.table.read(self.table.sel_next_priority, (*z, cursor))
            if not first:
                return best
            vesting = first[0].o_vesting
            best = vesting if best is None else min(best, vesting)
            cursor = first[0].o_priority + 1

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        """Strong emptiness check inside the pointer-deleting transaction ``tr``.

        ``tr``'s read version is fixed before Cassandra is read (at SERIAL, so an
        in-progress conditional insert is finished or refused first): an enqueue whose
        pointer transaction committed before that version wrote its item before, so the
        read sees it; one committing after conflicts on the pointer index key. A failed
        read raises, and no pointer is deleted on a guess.
        """
        tr.get_read_version()
        rows = self.table.read(self.table.sel_any_item, (zone.app, zone.tenant), serial=True)
        return not rows

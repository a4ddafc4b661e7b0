"""The item half of the two-part enqueue (paper section 5.1): a new item's record, order
entry and count, written in the producer's transaction; :mod:`quickzones.store.enqueue`
composes it with the pointer half. FIFO items are keyed by the commit's versionstamp."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from quickzones.clock import now_ms, vesting_after
from quickzones.errors import CorruptRecord
from quickzones.store import enqueue as two_part
from quickzones.store import flow_keys, sharded_counts
from quickzones.store.enqueue import Written
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    KVError,
    KVTransaction,
    get_many,
)
from quickzones.store.records import (
    STAMP_SIZE,
    WorkItem,
    ZoneId,
)
from quickzones.store.validation import check_name
from quickzones.store.zones.items import ZoneItems, new_item_id
from quickzones.store.zonestore import NewItem, new_record

# Orders FIFO items that share one commit (and so one versionstamp): a transaction runs in
# one process, so a process-wide increasing counter orders its items by enqueue call.
_fifo_seq = itertools.count()
_PENDING_STAMP = b"\x00" * STAMP_SIZE


class ZoneWrites(ZoneItems):
    def write_new_item(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item: NewItem,
        *,
        exists: bool | None = None,
        count: bool = True,
    ) -> Written:
        """The item half of the enqueue's part one, in ``tr``: record, order entry, count.

        No pointer work: :mod:`quickzones.store.enqueue` composes the two parts. An id already in
        the zone makes this a no-op (idempotent enqueue). ``exists``: whether the caller
        found the id's record, read in ``tr`` with a conflict as :meth:`_exists` reads it
        (None: not read yet).
        ``count=False``: the caller adds the items it wrote to the zone's count itself.
        """
        now = now_ms(self.clock)
        item_id = item.item_id if item.item_id is not None else new_item_id(self.ids)
        if item.item_id is not None:
            check_name("item_id", item.item_id)
            if exists is None:
                exists = False if item.fresh_id else self._exists(tr, zone, item_id)
            if exists:
                return Written(item_id, now, False)
        vesting = vesting_after(self.clock, item.delay_ms) if item.delay_ms else now
        fifo = item.fifo and item.delay_ms == 0
        record = new_record(item, item_id, now, vesting)
        if fifo:
            record = record.with_(commit_order=(_PENDING_STAMP, next(_fifo_seq)))
        if record.commit_order is not None:
            seq = record.commit_order[1]
            self._write_item(tr, zone, record, stamped=True)
            tr.set_versionstamped_key(
                self.keys.fifo_key_template(zone, item.priority, seq, item_id), b""
            )
        else:
            self._write_item(tr, zone, record)
            tr.set(self.keys.order_key(zone, item.priority, vesting, item_id), b"")
        if count:
            sharded_counts.add(tr, self.keys.count_key(zone), 1)
        return Written(item_id, vesting, True)

    def queued_item(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> WorkItem | None:
        """The item of this id, read in ``tr`` without a conflict (an enqueue compares it
        with the job it was asked to store); None when absent, or when ``tr`` wrote it as
        a FIFO item whose record is unreadable until commit (the same job, then)."""
        try:
            return self._read_item(tr, zone, item_id, snapshot=True)
        except KVError as err:
            if err.code != ACCESSED_UNREADABLE:
                raise
            return None

    def take_unleased(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> WorkItem | None:
        """Delete the item of this id from ``tr`` and return it, if it is queued and
        nobody holds it (a debounced item about to be replaced); None when it is gone,
        leased (running: left alone) or unreadable. Its record is read with a conflict,
        so a consumer leasing it meanwhile makes one of the two retry."""
        try:
            item = self._read_item(tr, zone, item_id)
        except CorruptRecord:
            return None  # a visit dead-letters it; the key starts a new item
        if item is None or item.lease_id is not None:
            return None
        self._delete_item(tr, zone, item)
        return item

    def write_new_items(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        items: Sequence[NewItem],
        *,
        read_also: Sequence[bytes] = (),
    ) -> tuple[list[Written], list[bytes | None]]:
        """:meth:`write_new_item` for each of ``items`` in ``tr``, in order, and one atomic
        add to the zone's count for those it wrote; returns what was written and the
        values of ``read_also``, keys the caller needs read in ``tr`` (with conflicts)
        before any of these writes, sent with the ids' reads.

        The ids are chosen before the transaction runs (a retry after
        ``commit_unknown_result`` must find what it wrote), so each is checked for an item
        already in the zone. Those reads go out together, one round trip for the batch
        instead of one per item; they are the reads :meth:`_exists` makes (with
        conflicts). An id given twice in the batch, or whose record this transaction
        versionstamped, is checked on its own; a fresh one (``NewItem.fresh_id``) is not
        read at all.
        """
        ids = list(
            dict.fromkeys(i.item_id for i in items if i.item_id is not None and not i.fresh_id)
        )
        for item_id in ids:
            check_name("item_id", item_id)  # before any read, as write_new_item does
        keys = [self.keys.item_key(zone, item_id) for item_id in ids]
        known: dict[str, bool] = {}
        try:
            raws = get_many(tr, [*keys, *read_also])
        except KVError as err:
            if err.code != ACCESSED_UNREADABLE:
                raise
            # This transaction versionstamped one of the records (a FIFO item it wrote):
            # every id is checked on its own, as write_new_item does.
            also = [tr.get(key) for key in read_also]
        else:
            known = {i: raw is not None for i, raw in zip(ids, raws[: len(ids)], strict=True)}
            also = raws[len(ids) :]
        out = []
        for item in items:
            # A repeat of an id is read again: it sees what its first occurrence wrote.
            exists = None if item.item_id is None else known.pop(item.item_id, None)
            out.append(self.write_new_item(tr, zone, item, exists=exists, count=False))
        written = sum(1 for w in out if w.new)
        if written:
            sharded_counts.add(tr, self.keys.count_key(zone), written)  # one atomic add
        return out, also

    def import_item(self, tr: KVTransaction, zone: ZoneId, item: WorkItem) -> bool:
        """Write ``item`` verbatim (id, priority, vesting, error count, attempts, type,
        payload, metadata) and ensure the zone's pointer, in ``tr``; for tenant moves and
        migrations. A no-op returning False if the id is already in the zone (idempotent).

        The caller passes an unleased record; a stored lease id would keep it invisible.
        """
        if self._exists(tr, zone, item.item_id):
            return False
        # A commit order means nothing in another store: the item is keyed by its vesting
        # time (its enqueue time, for a FIFO item), so it keeps its place to the millisecond.
        item = item.with_(commit_order=None)
        self._write_item(tr, zone, item)
        # An item waiting for its one-at-a-time key (the key's record copied first) stays
        # waiting: no order entry until the key passes to it.
        if flow_keys.waits_for(tr, self.keys, zone, item, snapshot=False) is None:
            tr.set(self.keys.order_key(zone, item.priority, item.vesting_ms, item.item_id), b"")
        sharded_counts.add(tr, self.keys.count_key(zone), 1)
        self.toplevel.ensure_pointer(tr, zone, item.vesting_ms)
        return True

    def enqueue(
        self,
        zone: ZoneId,
        item: NewItem,
        *,
        tr: KVTransaction | None = None,
        in_pointer_txn: Callable[[KVTransaction], None] | None = None,
    ) -> str:
        """The two-part enqueue (:mod:`quickzones.store.enqueue`): on its own, or inside ``tr``
        with part two following its commit."""
        return two_part.enqueue(
            self.kv if tr is None else tr, self.toplevel, self, zone, item, charge=in_pointer_txn
        )

    def enqueue_many(
        self,
        zone: ZoneId,
        items: Sequence[NewItem],
        *,
        in_pointer_txn: Callable[[KVTransaction, int], None] | None = None,
    ) -> list[str]:
        """All of ``items`` in one transaction, one pointer check
        (:mod:`quickzones.store.enqueue`)."""
        charge = in_pointer_txn

        def charge_all(tr: KVTransaction) -> None:
            if charge is not None:
                charge(tr, len(items))

        return two_part.enqueue_batch(self.kv, self.toplevel, self, zone, items, charge=charge_all)

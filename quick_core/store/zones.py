"""Queue zones over the KV seam (paper section 5): the KV implementation of ZoneStore.

A zone keeps, per item, a record and an order-index entry keyed by (priority, vesting,
item_id), plus a count kept with atomic adds. A lease is the item's vesting time moved into
the future with a fresh random lease id. Peek walks the order index one priority at a time
and reads only vested entries, so its cost does not grow with delayed or leased items.

FIFO items (enqueued with ``fifo`` and no delay) are keyed instead by (priority, commit
versionstamp, seq, item_id): the store's commit order, not the producers' clocks, orders
them. Their entries sort after the priority's vesting-keyed ones, so peek reads the vested
vesting-keyed entries (retries, delayed items, expired leases: work that has waited) and
then the FIFO entries, each a bounded range read. Their first lease re-keys them by vesting
time, as any lease does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from quickzones.clock import Clock, SystemClock, now_ms, vesting_after
from quickzones.errors import (
    CorruptRecord,
    InvalidArgument,
    ItemAlreadyQueued,
    ItemNotFound,
    ItemNotVested,
    LeaseLost,
)
from quickzones.store import enqueue as two_part
from quickzones.store import outcomes
from quickzones.store.enqueue import Written
from quickzones.store.ids import IdSource, random_ids
from quickzones.store.keys import KeySpace
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    OWN_STORE,
    VALUE_SIZE_LIMIT,
    KVError,
    KVStore,
    KVTransaction,
    get_many,
    pack_i64,
    prefetch_range,
    run,
    transactional,
    unpack_i64,
)
from quickzones.store.records import (
    STAMP_SIZE,
    DeadLetter,
    WorkItem,
    ZoneId,
    dead_letter_chunks,
    decode_dead_letter,
    decode_item,
    encode_dead_letter,
    encode_item,
    item_value_template,
)
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.validation import check_name
from quickzones.store.zonestore import CorruptItem, NewItem, ZoneStoreCapabilities

# A dequeue reads a zone of at most this many keys (entries, records, count) in one
# storage read first, where the store can answer later reads from it (kv.prefetch_range):
# a zone with a few items, the common visit, costs one storage read instead of about eight.
ZONE_PREFETCH_KEYS = 32

# Payloads above this are split into chunk keys so no value exceeds the KV value limit.
INLINE_PAYLOAD_LIMIT = 64 * 1024
CHUNK_SIZE = VALUE_SIZE_LIMIT - 1024

# Orders FIFO items that share one commit (and so one versionstamp): a transaction runs in
# one process, so a process-wide increasing counter orders its items by enqueue call.
_fifo_seq = itertools.count()
_PENDING_STAMP = b"\x00" * STAMP_SIZE


def new_lease_id(ids: IdSource = random_ids) -> str:
    """128 random bits (from ``secrets`` by default): unguessable, so no one completes by
    guessing."""
    return ids(16)


def new_item_id(ids: IdSource = random_ids) -> str:
    return ids(12)


# Meta of an item leased again after a lease lapsed: that lease's id, so its late holder
# is told its lease expired rather than that its id is wrong.
LAPSED_LEASE_META = "_lapsed_lease"


def lease_lost(item: WorkItem, lease_id: str, now: int) -> LeaseLost:
    """Why ``lease_id`` does not hold ``item`` (whose lease id is another), in words."""
    item_id = item.item_id
    if lease_id == item.meta.get(LAPSED_LEASE_META):
        return LeaseLost(
            item_id, "the lease expired and the item was leased again by another consumer"
        )
    if item.lease_id is None:
        return LeaseLost(
            item_id, "the item is not leased now: it was given back (nack) and waits to run"
        )
    if item.vesting_ms > now:
        return LeaseLost(
            item_id, "the lease id does not match the item's lease, which is live: another "
            "consumer holds it, or the id is wrong",
        )
    return LeaseLost(
        item_id, "the lease id does not match the item's lease, which expired: the item "
        "waits to be leased again",
    )


class KVZoneStore:
    """Zones whose items live in the same KV store as their pointers.

    Every method that takes ``tr`` runs inside it and never commits; without one it runs in
    its own transaction through :func:`quickzones.store.kv.run`.
    """

    # Items share the pointers' KV store, so everything a transaction can do is possible.
    capabilities: ZoneStoreCapabilities = ZoneStoreCapabilities(
        transactional_handlers=True,
        fifo=True,
        local_items=True,
        caller_transactions=True,
        outcome_records=True,
        one_transaction_visits=True,
        lookahead_dequeue=True,
    )

    def __init__(
        self,
        kv: KVStore,
        toplevel: TopLevelQueue,
        *,
        keys: KeySpace | None = None,
        clock: Clock | None = None,
        ids: IdSource | None = None,
    ) -> None:
        self.kv = kv
        self.toplevel = toplevel
        self.keys = keys or toplevel.keys
        self.clock = clock or SystemClock()
        # Item and lease ids; by default the top-level queue's source (``secrets``).
        self.ids = ids or toplevel.ids

    # --- records -----------------------------------------------------------------------

    def _write_item(
        self, tr: KVTransaction, zone: ZoneId, item: WorkItem, *, stamped: bool = False
    ) -> None:
        """Write the record (and payload chunks); ``stamped``: the record of a new FIFO
        item, whose commit versionstamp the commit writes into it."""
        key = self.keys.item_key(zone, item.item_id)
        chunks: list[bytes] = []
        if len(item.payload) > INLINE_PAYLOAD_LIMIT:
            chunks = [
                item.payload[i : i + CHUNK_SIZE] for i in range(0, len(item.payload), CHUNK_SIZE)
            ]
            item = item.with_(meta={**item.meta, "_chunks": len(chunks)})
        if stamped:
            tr.set_versionstamped_value(key, item_value_template(item, include_payload=not chunks))
        else:
            tr.set(key, encode_item(item, include_payload=not chunks))
        for n, chunk in enumerate(chunks):
            tr.set(self.keys.item_chunk_key(zone, item.item_id, n), chunk)

    def _order_key_of(self, zone: ZoneId, item: WorkItem) -> bytes:
        """Where ``item``'s order entry is: by commit order (FIFO, never leased) or by
        vesting time."""
        if item.commit_order is None:
            return self.keys.order_key(zone, item.priority, item.vesting_ms, item.item_id)
        stamp, seq = item.commit_order
        return self.keys.fifo_key(zone, item.priority, stamp, seq, item.item_id)

    def _rewrite_header(
        self, tr: KVTransaction, zone: ZoneId, old: WorkItem, new: WorkItem
    ) -> None:
        """Rewrite an item's record after a lease/requeue without touching its chunks."""
        key = self.keys.item_key(zone, new.item_id)
        if "_chunks" in old.meta:
            tr.set(key, encode_item(new, include_payload=False))
        else:
            tr.set(key, encode_item(new))

    def _read_item(
        self, tr: KVTransaction, zone: ZoneId, item_id: str, *, snapshot: bool = False
    ) -> WorkItem | None:
        key = self.keys.item_key(zone, item_id)
        raw = tr.get(key, snapshot=snapshot)
        if raw is None:
            return None
        return self._decode(tr, zone, key, raw, snapshot=snapshot)

    def _decode(
        self, tr: KVTransaction, zone: ZoneId, key: bytes, raw: bytes, *, snapshot: bool = False
    ) -> WorkItem:
        head = decode_item(key, raw)
        chunks = head.meta.get("_chunks")
        if chunks is None:
            return head
        begin = self.keys.item_chunk_key(zone, head.item_id, 0)
        end = self.keys.item_chunk_key(zone, head.item_id, int(chunks))
        parts = tr.get_range(begin, end, snapshot=snapshot)
        if len(parts) != int(chunks):
            raise CorruptRecord(key, f"expected {chunks} payload chunks, found {len(parts)}")
        return head.with_(payload=b"".join(v for _, v in parts))

    def _delete_item(
        self, tr: KVTransaction, zone: ZoneId, item: WorkItem, *, count: bool = True
    ) -> None:
        """Clear the record, its chunks and order entry; ``count``: and decrement the
        zone's count (False: the caller adds the batch's total once)."""
        tr.clear(self.keys.item_key(zone, item.item_id))
        if "_chunks" in item.meta:
            begin = self.keys.item_chunk_key(zone, item.item_id, 0)
            end = self.keys.item_chunk_key(zone, item.item_id, int(item.meta["_chunks"]))
            tr.clear_range(begin, end)
        tr.clear(self._order_key_of(zone, item))
        if count:
            tr.add(self.keys.count_key(zone), pack_i64(-1))

    def _move_vesting(
        self, tr: KVTransaction, zone: ZoneId, old: WorkItem, new: WorkItem
    ) -> WorkItem:
        """Re-key ``old`` by ``new``'s vesting time (leaving commit order, if it had one);
        returns the item as stored."""
        if new.commit_order is not None:
            new = new.with_(commit_order=None)
        tr.clear(self._order_key_of(zone, old))
        tr.set(self.keys.order_key(zone, new.priority, new.vesting_ms, new.item_id), b"")
        self._rewrite_header(tr, zone, old, new)
        return new

    # --- enqueue -----------------------------------------------------------------------

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
        record = WorkItem(
            item_id=item_id,
            job_type=item.job_type,
            payload=item.payload,
            priority=item.priority,
            vesting_ms=vesting,
            enqueued_ms=now,
            content_type=item.content_type,
            deadline_ms=None if item.ttl_ms is None else now + item.ttl_ms,
            delivery=item.delivery,
            meta=dict(item.meta),
            commit_order=(_PENDING_STAMP, next(_fifo_seq)) if fifo else None,
        )
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
            tr.add(self.keys.count_key(zone), pack_i64(1))
        return Written(item_id, vesting, True)

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
            tr.add(self.keys.count_key(zone), pack_i64(written))  # one atomic add
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
        tr.set(self.keys.order_key(zone, item.priority, item.vesting_ms, item.item_id), b"")
        tr.add(self.keys.count_key(zone), pack_i64(1))
        self.toplevel.ensure_pointer(tr, zone, item.vesting_ms)
        return True

    def _exists(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> bool:
        try:
            return tr.get(self.keys.item_key(zone, item_id)) is not None
        except KVError as err:
            if err.code != ACCESSED_UNREADABLE:
                raise
            # This transaction wrote the id as a FIFO item, whose record holds a stamp
            # that is unreadable until commit: it exists.
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

    # --- reading -----------------------------------------------------------------------

    def _vested_entries(
        self, tr: KVTransaction, zone: ZoneId, max_items: int, now: int, *, snapshot: bool
    ) -> list[tuple[bytes, str]]:
        """(order key, item_id) of up to ``max_items`` vested items, in order.

        Per priority in use: one short read finds it, one range read takes its vested
        vesting-keyed entries and, if there is room, one more its FIFO entries. The cost is
        proportional to what is returned plus the priorities present.
        """
        begin, end = self.keys.order_range(zone)
        out: list[tuple[bytes, str]] = []
        cursor = begin
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
                out.extend((k, self.keys.unpack_order_key(zone, k)[2]) for k, _ in rows)
            # Skip the rest of this priority (not vested) in one hop.
            cursor = self.keys.order_priority_start(zone, priority + 1)
        return out

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        def read(tr: KVTransaction) -> list[WorkItem]:
            now = now_ms(self.clock)
            items = []
            for _, item_id in self._vested_entries(tr, zone, max_items, now, snapshot=True):
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
        empty it also clears the zone's zero count, so a collected tenant leaves no key
        behind (a million idle tenants cost nothing).
        """
        begin, end = self.keys.zone_range(zone)
        count_key = self.keys.count_key(zone)
        rows = tr.get_range(begin, end, limit=2)
        empty = all(k == count_key for k, _ in rows)
        if empty and rows:
            tr.clear(count_key)
        return empty

    def count(self, zone: ZoneId) -> int:
        return run(self.kv, lambda tr: unpack_i64(tr.get(self.keys.count_key(zone), snapshot=True)))

    # --- leases ------------------------------------------------------------------------

    def _grant_lease(
        self, tr: KVTransaction, zone: ZoneId, item: WorkItem, now: int, lease_ms: int
    ) -> WorkItem:
        # A lease counts as a run (attempts + 1) when it is granted: a Manager leases only
        # what its free workers start (Algorithm 1, line 5) and the lease extender keeps a
        # waiting item's lease, so a granted lease is a run unless it is given back
        # unstarted (requeue(ran=False) takes the count back). A lease that ran out
        # unreleased (completing, requeueing or giving back clears it) means its consumer
        # crashed or stalled while holding it: not a failed attempt (paper section 5), so
        # this lease replaces that one's count, and the lapse is counted apart
        # (RetryPolicy.max_lapses), so an item that kills its consumer every time ends.
        if item.lease_id is not None:
            counted: dict[str, object] = {
                "lapses": item.lapses + 1,
                "last_error": "lease lapsed: its consumer stopped or stalled while holding it",
                "meta": {**item.meta, LAPSED_LEASE_META: item.lease_id},
            }
        else:
            counted = {"attempts": item.attempts + 1}
        leased = item.with_(
            vesting_ms=now + lease_ms,
            lease_id=new_lease_id(self.ids),
            commit_order=None,
            **counted,
        )
        return self._move_vesting(tr, zone, item, leased)

    @transactional
    def start(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        *,
        tr: KVTransaction = OWN_STORE,
    ) -> WorkItem:
        """A Worker's check just before it starts an item that waited for it (Algorithm
        3): raises ``ItemNotFound`` (completed or cancelled meanwhile) or ``LeaseLost``
        (another holder), so such an item never starts; else returns the stored item.
        A read, no write: the run was counted when the lease was granted."""
        return self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem:
        _check_duration(lease_ms)

        def lease(tr: KVTransaction) -> WorkItem:
            item = self._read_item(tr, zone, item_id)
            if item is None:
                raise ItemNotFound(item_id)
            now = now_ms(self.clock)
            if item.vesting_ms > now:
                raise ItemNotVested(item_id, item.vesting_ms)
            return self._grant_lease(tr, zone, item, now, lease_ms)

        return run(self.kv, lease)

    def _entries_to_take(
        self, tr: KVTransaction, zone: ZoneId, max_items: int, now: int, horizon_ms: int
    ) -> list[tuple[bytes, str]]:
        """What a dequeue takes: vested entries first (invariant 6 among what is taken),
        then, in the room left, those vesting within ``horizon_ms``.

        One read to the horizon does for both when it leaves room or finds nothing ahead:
        then it holds every vested entry (a full read without entries ahead is the vested
        read's prefix). Only a full read with entries ahead falls back to two (a visit to a
        zone with a few items, the common case, reads each range once, not twice).
        """
        if not horizon_ms:
            return self._vested_entries(tr, zone, max_items, now, snapshot=False)
        upto = self._vested_entries(tr, zone, max_items, now + horizon_ms, snapshot=False)
        vested: list[tuple[bytes, str]] = []
        ahead: list[tuple[bytes, str]] = []
        for entry in upto:
            vesting = self.keys.unpack_order_key(zone, entry[0])[1]
            (vested if vesting is None or vesting <= now else ahead).append(entry)
        if not ahead or len(upto) < max_items:
            return vested + ahead
        entries = self._vested_entries(tr, zone, max_items, now, snapshot=False)
        seen = {item_id for _, item_id in entries}
        more = self._vested_entries(
            tr, zone, max_items + len(entries), now + horizon_ms, snapshot=False
        )
        return entries + [e for e in more if e[1] not in seen][: max_items - len(entries)]

    @transactional
    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        horizon_ms: int = 0,
        tr: KVTransaction = OWN_STORE,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease in one transaction (``tr``: a Manager's one-transaction visit).

        Expired (TTL) and corrupt items go to dead letters here, so neither can block the
        zone (invariant 8). With ``horizon_ms``, when the vested items leave room, items
        vesting within that many ms that nobody holds are leased too, each lease counted
        from its vesting time (its vesting is the returned ``vesting_ms`` minus
        ``lease_ms``): the consumer starts them on its own timer, never before then. An
        item leased by someone else is never taken before that lease runs out.
        """
        _check_duration(lease_ms)
        if horizon_ms < 0:
            raise ValueError(f"horizon_ms must be at least 0, not {horizon_ms}")

        def take(tr: KVTransaction) -> tuple[list[WorkItem], list[CorruptItem]]:
            now = now_ms(self.clock)
            leased: list[WorkItem] = []
            corrupt: list[CorruptItem] = []
            # A small zone whole in one storage read: its order entries, records and count
            # are read several times over by this dequeue and the pointer's requeue.
            prefetch_range(tr, *self.keys.zone_range(zone), ZONE_PREFETCH_KEYS)
            entries = self._entries_to_take(tr, zone, max_items, now, horizon_ms)
            keys = [self.keys.item_key(zone, item_id) for _, item_id in entries]
            # All item reads sent at once: a visit of many items is one round trip.
            for (order_key, item_id), key, raw in zip(
                entries, keys, get_many(tr, keys), strict=True
            ):
                if raw is None:
                    # An order entry without its item: repair the index.
                    tr.clear(order_key)
                    continue
                try:
                    item = self._decode(tr, zone, key, raw)
                except CorruptRecord as err:
                    self._dead_letter_raw(tr, zone, item_id, raw, err.reason, now)
                    tr.clear_range(*self.keys.items_range_of(zone, item_id))
                    tr.clear(order_key)
                    tr.add(self.keys.count_key(zone), pack_i64(-1))
                    corrupt.append(CorruptItem(item_id, err.reason))
                    continue
                if resolve is not None:
                    item = resolve(item)
                if item.deadline_ms is not None and now > item.deadline_ms:
                    self._bury(tr, zone, item, "expired: not started before its TTL")
                    continue
                if item.vesting_ms > now and item.lease_id is not None:
                    continue  # ahead of time, but its holder's lease still runs
                if accept is not None and not accept(item):
                    continue  # e.g. its job type is at its concurrency cap: leave it vested
                # At-most-once items are leased like any other: the consumer deletes one
                # (holding its lease) only when its handler starts, so an item taken but
                # never started (shutdown, a concurrency cap) is given back, not lost.
                since = max(now, item.vesting_ms)  # an item taken ahead: from its vesting
                leased.append(self._grant_lease(tr, zone, item, since, lease_ms))
            return leased, corrupt

        return take(tr)

    def _check_holder(self, item: WorkItem | None, item_id: str, lease_id: str) -> WorkItem:
        if item is None:
            raise ItemNotFound(item_id)
        if item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        return item

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since
        (the lease id is unchanged then)."""
        _check_duration(lease_ms)

        def extend(tr: KVTransaction) -> WorkItem:
            item = self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)
            return self._move_vesting(
                tr,
                zone,
                item,
                item.with_(vesting_ms=now_ms(self.clock) + lease_ms, commit_order=None),
            )

        return run(self.kv, extend)

    @transactional
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
        tr: KVTransaction = OWN_STORE,
    ) -> WorkItem:
        item = self._check_holder(self._read_item(tr, zone, item_id), item_id, lease_id)
        updated = item.with_(
            vesting_ms=max(vesting_after(self.clock, delay_ms), not_before_ms or 0),
            lease_id=None,
            # Given back unstarted: this lease was no run, so its count is taken back.
            attempts=item.attempts if ran else max(0, item.attempts - 1),
            error_count=item.error_count + (1 if count_error else 0),
            last_error=error if error is not None else item.last_error,
            meta={**item.meta, **meta} if meta else item.meta,
            commit_order=None,
        )
        return self._move_vesting(tr, zone, item, updated)

    @transactional
    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        result: Any = None,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        item = self._read_item(tr, zone, item_id)
        if item is None:
            raise ItemNotFound(item_id)
        if lease_id is not None and item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        self._delete_item(tr, zone, item)
        state = outcomes.COMPLETED if lease_id is not None else outcomes.CANCELLED
        outcomes.finished(tr, self.keys, zone, item, state, now_ms(self.clock), result=result)

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,
    ) -> list[Exception | None]:
        """One transaction for a batch: an item another holder took is reported, not fatal.

        After a maybe-committed attempt (``commit_unknown_result``) the retry finds the
        items that attempt completed gone: they are reported completed, not lost.
        """
        return self.complete_zones([(zone, leased, results)])[0]

    def complete_zones(
        self,
        groups: Sequence[tuple[ZoneId, Sequence[tuple[str, str]], Mapping[str, Any] | None]],
    ) -> list[list[Exception | None]]:
        """:meth:`complete_many` for several zones in one transaction: one outcome list
        per (zone, [(item_id, lease_id)], results) group, in order.

        Each item is checked as :meth:`complete` checks it (its record read with a
        conflict; a lease id must match the stored one, else :class:`LeaseLost`; no record,
        :class:`ItemNotFound`), so a completion that lost its lease is reported per item
        and the others still commit. Every record is read at once (one round trip for
        the batch) and used as read: nothing is read twice. Each zone's count moves by
        one atomic add. A group's ``results``: handler return values by item id, kept if
        the item's type asks.
        """
        maybe_done: set[tuple[ZoneId, str]] = set()
        attempt: list[tuple[ZoneId, str]] = []

        def batch(tr: KVTransaction) -> list[list[Exception | None]]:
            attempt.clear()
            keys = [
                self.keys.item_key(zone, item_id)
                for zone, leased, _ in groups
                for item_id, _ in leased
            ]
            raws = iter(get_many(tr, keys))
            key_iter = iter(keys)
            now = now_ms(self.clock)
            out: list[list[Exception | None]] = []
            deleted: set[bytes] = set()
            for zone, leased, results in groups:
                zone_out: list[Exception | None] = []
                done = 0
                for item_id, lease_id in leased:
                    key, raw = next(key_iter), next(raws)
                    if key in deleted:
                        raw = None  # a repeat of an item completed above finds it gone
                    if raw is None:
                        gone = (zone, item_id) in maybe_done
                        zone_out.append(None if gone else ItemNotFound(item_id))
                        continue
                    try:
                        item = self._decode(tr, zone, key, raw)
                    except CorruptRecord as err:
                        zone_out.append(err)
                        continue
                    if lease_id is not None and item.lease_id != lease_id:
                        zone_out.append(lease_lost(item, lease_id, now))
                        continue
                    self._delete_item(tr, zone, item, count=False)
                    deleted.add(key)
                    done += 1
                    state = outcomes.COMPLETED if lease_id is not None else outcomes.CANCELLED
                    result = None if results is None else results.get(item_id)
                    outcomes.finished(tr, self.keys, zone, item, state, now, result=result)
                    attempt.append((zone, item_id))
                    zone_out.append(None)
                if done:
                    tr.add(self.keys.count_key(zone), pack_i64(-done))
                out.append(zone_out)
            return out

        def remember(err: KVError) -> None:
            if err.maybe_committed:
                maybe_done.update(attempt)

        return run(self.kv, batch, on_retry=remember)

    def cancel(self, zone: ZoneId, item_id: str) -> None:
        """Delete an item whoever holds it."""
        self.complete(zone, item_id, None)

    # --- dead letters ------------------------------------------------------------------

    def _bury(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item: WorkItem,
        reason: str,
        *,
        count_error: bool = False,
        traceback: str | None = None,
    ) -> None:
        """Move an item out of its zone into the dead-letter store, in ``tr``.

        ``count_error``: the run that failed counts as an error (error count + 1, last error
        = ``reason``), so a dead letter's error count agrees with its attempts.
        """
        self._delete_item(tr, zone, item)
        stored = item.with_(
            lease_id=None,
            commit_order=None,
            meta={k: v for k, v in item.meta.items() if k != "_chunks"},
        )
        if count_error:
            stored = stored.with_(error_count=item.error_count + 1, last_error=reason)
        outcomes.finished(
            tr, self.keys, zone, stored, outcomes.DEAD_LETTERED, now_ms(self.clock), reason=reason
        )
        self._dead_letter_raw(
            tr,
            zone,
            item.item_id,
            encode_item(stored),
            reason,
            now_ms(self.clock),
            traceback=traceback,
        )

    def _dead_letter_raw(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item_id: str,
        raw: bytes,
        reason: str,
        now: int,
        *,
        traceback: str | None = None,
    ) -> None:
        """Write a dead letter keeping the whole item record ``raw``: inline when small,
        else split across chunk keys as a large item's payload is (a 1 MiB payload does not
        fit in one value)."""
        key = self.keys.dead_letter_key(zone, item_id)
        # A letter of the same id written earlier may have more chunks: clear them all.
        tr.clear_range(*self.keys.dead_letter_range_of(zone, item_id))
        if len(raw) <= INLINE_PAYLOAD_LIMIT:
            tr.set(key, encode_dead_letter(reason, now, raw, traceback=traceback))
            return
        chunks = [raw[i : i + CHUNK_SIZE] for i in range(0, len(raw), CHUNK_SIZE)]
        tr.set(key, encode_dead_letter(reason, now, None, chunks=len(chunks), traceback=traceback))
        for n, chunk in enumerate(chunks):
            tr.set(self.keys.dead_letter_chunk_key(zone, item_id, n), chunk)

    @transactional
    def read_dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        *,
        snapshot: bool = False,
        tr: KVTransaction = OWN_STORE,
    ) -> DeadLetter | None:
        """One dead letter with its chunks, read in one transaction."""
        key = self.keys.dead_letter_key(zone, item_id)
        raw = tr.get(key, snapshot=snapshot)
        if raw is None:
            return None
        chunks: list[bytes] | None = None
        n = dead_letter_chunks(key, raw)
        if n:
            begin = self.keys.dead_letter_chunk_key(zone, item_id, 0)
            end = self.keys.dead_letter_chunk_key(zone, item_id, n)
            chunks = [v for _, v in tr.get_range(begin, end, snapshot=snapshot)]
        return decode_dead_letter(key, raw, zone, item_id, chunks)

    @transactional
    def take_dead_letter(
        self, zone: ZoneId, item_id: str, *, tr: KVTransaction = OWN_STORE
    ) -> NewItem:
        """Remove a dead letter and return its item, with a clean error count, for the
        caller to enqueue in the same transaction (``tr=tr``): both happen or neither.

        Raises :class:`ItemNotFound` without a dead letter, :class:`ItemAlreadyQueued` when
        the zone holds an item of the same id (nothing changes then), and
        :class:`CorruptRecord` for a dead letter whose item cannot be decoded.
        """
        letter = self.read_dead_letter(zone, item_id, tr=tr)
        if letter is None:
            raise ItemNotFound(item_id)
        if letter.item is None:
            raise CorruptRecord(
                self.keys.dead_letter_key(zone, item_id),
                "the dead item's record is corrupt; it cannot be requeued",
            )
        if self._exists(tr, zone, item_id):
            # An enqueue would treat the id as an idempotent repeat and store nothing.
            raise ItemAlreadyQueued(str(zone), item_id)
        item = letter.item
        tr.clear_range(*self.keys.dead_letter_range_of(zone, item_id))
        return NewItem(
            job_type=item.job_type,
            payload=item.payload,
            priority=item.priority,
            item_id=item.item_id,
            content_type=item.content_type,
            delivery=item.delivery,
            meta={k: v for k, v in item.meta.items() if k != "_chunks"},
        )

    @transactional
    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        """Dead-letter an item. With ``lease_id`` its holder's run failed: that attempt
        counts as an error (error count + 1, last error = ``reason``), so the dead letter's
        error count agrees with its attempts; without one (an operator's decision) the
        counts are kept as they are."""
        item = self._read_item(tr, zone, item_id)
        if item is None:
            raise ItemNotFound(item_id)
        if lease_id is not None and item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now_ms(self.clock))
        self._bury(tr, zone, item, reason, count_error=lease_id is not None, traceback=traceback)

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        def drop(tr: KVTransaction) -> None:
            key = self.keys.item_key(zone, item_id)
            raw = tr.get(key)
            if raw is None:
                return
            self._dead_letter_raw(tr, zone, item_id, raw, "corrupt record", now_ms(self.clock))
            tr.clear_range(*self.keys.items_range_of(zone, item_id))
            tr.add(self.keys.count_key(zone), pack_i64(-1))

        run(self.kv, drop)


def _check_duration(lease_ms: int) -> None:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
        raise InvalidArgument("lease duration", lease_ms, "must be a positive number of ms")

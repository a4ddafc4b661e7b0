"""An item's keys in its zone: the record (with payload chunks when large), the order-index
entry that says when it vests, and the zone's count; every zone operation reads and writes
items through these, so each key is spelled once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from quickzones.clock import Clock, SystemClock
from quickzones.errors import (
    CorruptRecord,
    InvalidArgument,
    LeaseLost,
)
from quickzones.store.ids import IdSource, random_ids
from quickzones.store.keys import KeySpace
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    VALUE_SIZE_LIMIT,
    KVError,
    KVStore,
    KVTransaction,
    pack_i64,
)
from quickzones.store.lease_rules import LAPSED_LEASE_META
from quickzones.store.records import (
    WorkItem,
    ZoneId,
    decode_item,
    encode_item,
    item_value_template,
)
from quickzones.store.toplevel import TopLevelQueue

if TYPE_CHECKING:
    from quickzones.store.batches import BatchWriter

# Payloads above this are split into chunk keys so no value exceeds the KV value limit.
INLINE_PAYLOAD_LIMIT = 64 * 1024
CHUNK_SIZE = VALUE_SIZE_LIMIT - 1024
# Records written at a lease that this store keeps, by their bytes, until it reads them
# back (ZoneItems._leased): at most this many, each at most this long, so what is kept
# stays small beside the items held.
LEASED_KEPT = 1024
LEASED_RECORD_MAX = 2048


def new_lease_id(ids: IdSource = random_ids) -> str:
    """128 random bits (from ``secrets`` by default): unguessable, so no one completes by
    guessing."""
    return ids(16)


def new_item_id(ids: IdSource = random_ids) -> str:
    return ids(12)




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
            item_id,
            "the lease id does not match the item's lease, which is live: another "
            "consumer holds it, or the id is wrong",
        )
    return LeaseLost(
        item_id,
        "the lease id does not match the item's lease, which expired: the item "
        "waits to be leased again",
    )


def check_lease_duration(lease_ms: int) -> None:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
        raise InvalidArgument("lease duration", lease_ms, "must be a positive number of ms")


class ZoneItems:
    """The KV zone store's state and its item-level reads and writes, in a caller's
    transaction."""

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
        # The records this store wrote at a lease, by their bytes, each taken back by the
        # first read that finds exactly those bytes stored (the completion's lease check,
        # a start check): the same bytes are the same item, so it is not decoded again.
        # A lease id is new at each lease, so other bytes (a record extended, requeued or
        # leased by another holder since) never match and are decoded as read.
        self._leased: dict[bytes, WorkItem] = {}

    def tag_item(
        self, tr: KVTransaction, zone: ZoneId, item_id: str, key: str, value: Any
    ) -> WorkItem | None:
        """Add ``meta[key] = value`` to a queued or running item's record, in ``tr`` (its
        record read with a conflict, so a lease, completion or other write of it racing
        this one aborts one of them), unless its meta has ``key`` already. Returns the
        item as read (None: no such item)."""
        item = self._read_item(tr, zone, item_id)
        if item is not None and key not in item.meta:
            self._rewrite_header(tr, zone, item, item.with_(meta={**item.meta, key: value}))
        return item

    def _batches(self) -> BatchWriter:
        """This store as the batches' item writer: the parts of :class:`KVZoneStore` are
        mixed into one class, whose writes part is what :mod:`..batches` calls."""
        return cast("BatchWriter", self)

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
    ) -> bytes | None:
        """Rewrite an item's record after a lease/requeue without touching its chunks;
        returns the record written when it is the whole item (no chunks)."""
        key = self.keys.item_key(zone, new.item_id)
        if "_chunks" in old.meta:
            tr.set(key, encode_item(new, include_payload=False))
            return None
        raw = encode_item(new)
        tr.set(key, raw)
        return raw

    def _keep_leased(self, raw: bytes | None, item: WorkItem) -> None:
        """Keep the record ``raw`` just written at a lease as ``item`` (see ``_leased``);
        a lease whose transaction did not commit leaves bytes no read will find, dropped
        with the rest when the store keeps too many."""
        if raw is None or len(raw) > LEASED_RECORD_MAX:
            return
        if len(self._leased) >= LEASED_KEPT:
            self._leased.clear()
        self._leased[raw] = item

    def _read_item(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        item_id: str,
        *,
        snapshot: bool = False,
        keep: bool = False,
    ) -> WorkItem | None:
        key = self.keys.item_key(zone, item_id)
        raw = tr.get(key, snapshot=snapshot)
        if raw is None:
            return None
        return self._decode(tr, zone, key, raw, snapshot=snapshot, keep=keep)

    def _decode(
        self,
        tr: KVTransaction,
        zone: ZoneId,
        key: bytes,
        raw: bytes,
        *,
        snapshot: bool = False,
        keep: bool = False,
    ) -> WorkItem:
        """The item ``raw`` holds: the one kept at its lease when these are the bytes
        written then (taken back, or with ``keep`` left for a later read: a start check
        leaves it for the completion), else decoded."""
        kept = self._leased.get(raw) if keep else self._leased.pop(raw, None)
        if kept is not None:
            return kept
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

    def take_turn(self, tr: KVTransaction, zone: ZoneId, item_id: str | None) -> None:
        """A one-at-a-time key passed to ``item_id`` (parked, :mod:`quickzones.store.flow_keys`)
        in ``tr``, the finishing transaction: its order entry, at its own vesting time, and
        the zone's pointer pulled to it after the commit, as an enqueue's would be."""
        if item_id is None:
            return
        from quickzones.store.enqueue import pointer_check  # enqueue composes this store

        item = self._read_item(tr, zone, item_id)
        if item is None or item.lease_id is not None:
            return
        tr.set(self._order_key_of(zone, item), b"")
        pointer_check(tr, self.toplevel, zone, item.vesting_ms)

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
        self,
        tr: KVTransaction,
        zone: ZoneId,
        old: WorkItem,
        new: WorkItem,
        *,
        leased: bool = False,
        old_key: bytes | None = None,
    ) -> WorkItem:
        """Re-key ``old`` by ``new``'s vesting time (leaving commit order, if it had one);
        returns the item as stored. ``leased``: a new lease's record, kept (``_leased``)
        for its holder's completion to read back undecoded. ``old_key``: ``old``'s order
        key as the caller read it (None: packed here)."""
        if new.commit_order is not None:
            new = new.with_(commit_order=None)
        tr.clear(self._order_key_of(zone, old) if old_key is None else old_key)
        tr.set(self.keys.order_key(zone, new.priority, new.vesting_ms, new.item_id), b"")
        raw = self._rewrite_header(tr, zone, old, new)
        if leased:
            self._keep_leased(raw, new)
        return new

    def _exists(self, tr: KVTransaction, zone: ZoneId, item_id: str) -> bool:
        try:
            return tr.get(self.keys.item_key(zone, item_id)) is not None
        except KVError as err:
            if err.code != ACCESSED_UNREADABLE:
                raise
            # This transaction wrote the id as a FIFO item, whose record holds a stamp
            # that is unreadable until commit: it exists.
            return True

"""The key layout, in one place. Every key is an ``fdb.tuple`` under one root prefix, so
the bytes are identical on every KV backend.

    (root, "z", app, tenant, "i", item_id)                      -> item record
    (root, "z", app, tenant, "i", item_id, n)                   -> payload chunk n
    (root, "z", app, tenant, "x", priority, vesting, item_id)   -> b""  (order index: waiting)
    (root, "z", app, tenant, "x", priority, <stamp>, seq, item_id) -> b"" (order index: FIFO)
    (root, "z", app, tenant, "n")                               -> LE count (atomic add)
    (root, "z", app, tenant, "n", shard)                        -> LE, shards 1-15 (sharded_counts)
    (root, "c", cluster, shard, "p", pointer_id)                -> pointer record
    (root, "c", cluster, shard, "v", vesting, pointer_id)       -> b""  (pointer vesting index)
    (root, "c", cluster, shard, "ix", app, tenant)              -> pointer_id (pointer index)
    (root, "c", cluster, shard, "l", ...)                       -> local work items (a zone)
    (root, "d", app, tenant, item_id)                           -> dead letter record
    (root, "d", app, tenant, item_id, n)                        -> dead item's record, chunk n
    (root, "m", name...)                                        -> metadata (checkpoints, limits)
    (root, "m", "layout", cluster)                              -> a top-level queue's layout
    (root, "m", "bad_pointer", cluster, shard, pointer_id)      -> a pointer record set aside
    (root, "m", "periodic", schedule)                           -> last enqueued slot (LE i64)
    (root, "o", app, tenant, item_id)                           -> outcome of a finished item
    (root, "oe", expires_ms, app, tenant, item_id)              -> b""  (outcome expiry index)
    (root, "k", app, tenant, kind, key)                         -> flow key record (flow_keys.py)
    (root, "k", app, tenant, "w", key, seq)                     -> item waiting for a key
    (root, "ke", expires_ms, app, tenant, kind, key)            -> b""  (flow key expiry index)

Outcome records (``outcomes.py``) sit outside the zone range, so they never keep a zone's
pointer alive; the expiry index is collected from its start, never by a scan of tenants.
Flow keys (idempotency and debounce keys) sit beside them for the same reason.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass

from quickzones.store.kv import strinc
from quickzones.store.records import STAMP_SIZE, ZoneId
from quickzones.store.tuple_layer import fdbtuple

Range = tuple[bytes, bytes]

# The tuple layer's type code of a 96-bit versionstamp (10 bytes commit stamp + 2 bytes user
# version). Every integer's code is below it, so within a priority the FIFO entries sort
# after every entry keyed by vesting time.
VERSIONSTAMP_CODE = b"\x33"


def _tup(*parts: object) -> bytes:
    packed: bytes = fdbtuple.pack(parts)
    return packed


@functools.lru_cache(maxsize=65536)
def _zone_prefix(root: str, app: str, tenant: str) -> bytes:
    # Every key of every item starts with its zone's prefix; packing it once per zone
    # instead of once per key is about a tenth of the CPU per item (bench/REPORT.md).
    if app == LOCAL_APP:
        cluster, _, shard = tenant.rpartition("/")
        return _tup(root, "c", cluster, int(shard), "l")
    return _tup(root, "z", app, tenant)


def _packed_id(item_id: str) -> bytes:
    # An item's id is packed into its record key and its order key on enqueue, on every
    # lease and on completion. A flat tuple's packing is its elements' packings
    # concatenated, so the pieces built here and below are exactly fdb.tuple.pack's bytes
    # (tests/unit/test_keys.py). A text element is the tuple layer's code 0x02, its UTF-8
    # with each NUL escaped as NUL 0xff, and a NUL: a tenth of fdb.tuple's cost, and a
    # new id (every enqueue's) fills no cache.
    return b"\x02" + item_id.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"


@functools.lru_cache(maxsize=1024)
def _packed_int(value: int) -> bytes:
    # A priority: a zone's items have few of them.
    return _tup(value)


def _packed_order(priority: int, vesting_ms: int) -> bytes:
    # Each millisecond has a new vesting time, so a cache of (priority, vesting) pairs
    # would miss at most enqueues: the priority's packing cached, the time's by hand.
    return _packed_int(priority) + _packed_uint(vesting_ms)


@functools.lru_cache(maxsize=65536)
def _zone_tail(app: str, tenant: str) -> bytes:
    # (app, tenant) at the end of a zone's pointer index key.
    return _tup(app, tenant)


@functools.lru_cache(maxsize=1024)
def _shard_part(root: str, cluster: str, shard: int, tag: str) -> bytes:
    # (root, "c", cluster, shard, tag): every pointer key of a shard starts with one of a
    # few of these; a visit packs about a dozen pointer keys, at tens of µs each in full.
    return _tup(root, "c", cluster, shard, tag)


@functools.lru_cache(maxsize=64)
def _meta_head(root: str) -> bytes:
    return _tup(root, "m")


def _packed_part(part: object) -> bytes:
    # One element of a flat tuple: text and non-negative integers by hand (exact types:
    # a bool is an int the tuple layer packs otherwise), anything else by fdb.tuple.
    kind = type(part)
    if kind is str:
        return _packed_id(part)  # type: ignore[arg-type]
    if kind is int and 0 <= part < 1 << 63:  # type: ignore[operator]
        return _packed_uint(part)  # type: ignore[arg-type]
    return _tup(part)


def _packed_uint(value: int) -> bytes:
    # The tuple layer's encoding of one integer: for 0 <= value < 2**63, type code 0x14 plus
    # its byte length, then its big-endian bytes; anything else goes through fdb.tuple.
    if 0 <= value < 1 << 63:
        size = (value.bit_length() + 7) // 8
        return bytes((0x14 + size,)) + value.to_bytes(size, "big")
    return _tup(value)


def _unpack_uint_and_name(packed: bytes) -> tuple[int, str]:
    """(int, str) from their packing; the common case (a non-negative int, a name
    without NUL) by hand, anything else through fdb.tuple."""
    code = packed[0] if packed else 0
    if 0x14 <= code <= 0x1C and (code < 0x1C or packed[1] < 0x80):  # below 2**63
        end = 1 + code - 0x14
        rest = packed[end:]
        if len(rest) >= 2 and rest[0] == 0x02 and rest[-1] == 0 and 0 not in rest[1:-1]:
            return int.from_bytes(packed[1:end], "big"), rest[1:-1].decode("utf-8")
    value, name = fdbtuple.unpack(packed)
    return int(value), str(name)


def _unpack_int(packed: bytes, at: int) -> tuple[int, int] | None:
    """An integer of at most 8 bytes packed at ``at`` and where its packing ends; None
    for anything else (a bigger integer, another type)."""
    code = packed[at] if at < len(packed) else 0
    if 0x14 <= code <= 0x1C:  # zero or positive: code 0x14 plus its length, big-endian
        end = at + 1 + code - 0x14
        return int.from_bytes(packed[at + 1 : end], "big"), end
    if 0x0C <= code < 0x14:  # negative: its one's complement, code 0x14 minus its length
        size = 0x14 - code
        end = at + 1 + size
        return int.from_bytes(packed[at + 1 : end], "big") - (1 << (8 * size)) + 1, end
    return None


def _unpack_order_tail(packed: bytes) -> tuple[int, int, str] | None:
    """(priority, vesting, item_id) of a vesting-keyed order entry's packed tail, by hand
    (every dequeue and requeue reads a few: fdb.tuple's unpack is ten times slower); None
    for what it does not cover (a FIFO entry, an id with a NUL), which fdb.tuple reads."""
    priority = _unpack_int(packed, 0)
    if priority is None:
        return None
    vesting = _unpack_int(packed, priority[1])
    if vesting is None:
        return None
    rest = packed[vesting[1] :]
    if len(rest) < 2 or rest[0] != 0x02 or rest[-1] != 0 or 0 in rest[1:-1]:
        return None
    return priority[0], vesting[0], rest[1:-1].decode("utf-8")


_ITEM_TAG = _tup("i")
_ORDER_TAG = _tup("x")
_COUNT_TAG = _tup("n")
# The end of a priority's FIFO entries: the byte after the versionstamp's type code.
_AFTER_VERSIONSTAMPS = bytes([VERSIONSTAMP_CODE[0] + 1])

# Local work items of a top-level queue live in a zone whose app is this reserved name.
LOCAL_APP = "\x00local"


def tuple_range(prefix: bytes) -> Range:
    """Keys strictly extending a packed tuple prefix (fdb.tuple.range semantics)."""
    return prefix + b"\x00", prefix + b"\xff"


@dataclass(frozen=True, slots=True)
class KeySpace:
    """All key shapes under one root prefix."""

    root: str = "quick"

    def _pack(self, *parts: object) -> bytes:
        return _tup(self.root, *parts)

    def unpack(self, key: bytes) -> tuple[object, ...]:
        out: tuple[object, ...] = fdbtuple.unpack(key)[1:]
        return out

    # --- zones -------------------------------------------------------------------------

    def zone_prefix(self, zone: ZoneId) -> bytes:
        # (root, "z", app, tenant); a top-level queue's local zone: (root, "c", cluster, shard, "l")
        return _zone_prefix(self.root, zone.app, zone.tenant)

    def zone_range(self, zone: ZoneId) -> Range:
        return tuple_range(self.zone_prefix(zone))

    def item_key(self, zone: ZoneId, item_id: str) -> bytes:
        # (root, "z", app, tenant, "i", item_id); the prefix's cache called here directly,
        # as in order_key and count_key: an enqueue builds all three.
        return _zone_prefix(self.root, zone.app, zone.tenant) + _ITEM_TAG + _packed_id(item_id)

    def item_chunk_key(self, zone: ZoneId, item_id: str, n: int) -> bytes:
        # (root, "z", app, tenant, "i", item_id, n)
        return self.zone_prefix(zone) + _tup("i", item_id, n)

    def items_range(self, zone: ZoneId) -> Range:
        return tuple_range(self.zone_prefix(zone) + _tup("i"))

    def order_key(self, zone: ZoneId, priority: int, vesting_ms: int, item_id: str) -> bytes:
        # (root, "z", app, tenant, "x", priority, vesting, item_id)
        return (
            _zone_prefix(self.root, zone.app, zone.tenant)
            + _ORDER_TAG
            + _packed_order(priority, vesting_ms)
            + _packed_id(item_id)
        )

    def fifo_key(self, zone: ZoneId, priority: int, stamp: bytes, seq: int, item_id: str) -> bytes:
        # (root, "z", app, tenant, "x", priority, Versionstamp(stamp), seq, item_id).
        # Packed by hand: fdb.tuple.Versionstamp.to_bytes needs libfdb_c loaded, and this
        # is the tuple layer's exact encoding (code 0x33, 10 + 2 bytes, no escaping).
        return (
            self.zone_prefix(zone)
            + _tup("x", priority)
            + VERSIONSTAMP_CODE
            + stamp
            + b"\x00\x00"
            + _tup(seq, item_id)
        )

    def fifo_key_template(self, zone: ZoneId, priority: int, seq: int, item_id: str) -> bytes:
        """A FIFO order key for ``set_versionstamped_key``: the commit fills in the stamp."""
        head = self.zone_prefix(zone) + _tup("x", priority) + VERSIONSTAMP_CODE
        key = head + b"\x00" * STAMP_SIZE + b"\x00\x00" + _tup(seq, item_id)
        return key + struct.pack("<I", len(head))

    def fifo_range(self, zone: ZoneId, priority: int) -> Range:
        """The FIFO entries of one priority, in commit order."""
        head = self.order_priority_start(zone, priority)
        return head + VERSIONSTAMP_CODE, head + _AFTER_VERSIONSTAMPS

    def order_prefix(self, zone: ZoneId) -> bytes:
        return self.zone_prefix(zone) + _ORDER_TAG

    def order_range(self, zone: ZoneId) -> Range:
        return tuple_range(self.order_prefix(zone))

    def order_priority_range(self, zone: ZoneId, priority: int, vested_by_ms: int) -> Range:
        """Order entries of one priority with vesting <= ``vested_by_ms``."""
        head = self.order_priority_start(zone, priority)
        return head + b"\x00", head + _packed_uint(vested_by_ms + 1)

    def order_priority_start(self, zone: ZoneId, priority: int) -> bytes:
        """First possible order key of ``priority`` (and so after every lower one)."""
        # (root, "z", app, tenant, "x", priority): every dequeue and pointer requeue builds
        # a few of these, so they are concatenated from cached packings, not packed whole.
        return _zone_prefix(self.root, zone.app, zone.tenant) + _ORDER_TAG + _packed_int(priority)

    def items_range_of(self, zone: ZoneId, item_id: str) -> Range:
        """An item's record and all its payload chunks."""
        key = self.item_key(zone, item_id)
        return key, key + b"\xff"

    def unpack_order_key(self, zone: ZoneId, key: bytes) -> tuple[int, int | None, str]:
        """(priority, vesting, item_id); vesting is None for a FIFO entry, which is vested
        from its commit on."""
        packed = key[len(self.order_prefix(zone)) :]
        fast = _unpack_order_tail(packed)
        if fast is not None:
            return fast
        parts = fdbtuple.unpack(packed)
        if len(parts) == 3:
            return int(parts[0]), int(parts[1]), str(parts[2])
        return int(parts[0]), None, str(parts[3])

    def count_key(self, zone: ZoneId) -> bytes:
        # (root, "z", app, tenant, "n"), and its shards (root, "z", app, tenant, "n", s):
        # sharded_counts
        return _zone_prefix(self.root, zone.app, zone.tenant) + _COUNT_TAG

    def all_zones_range(self) -> Range:
        return tuple_range(self._pack("z"))

    # --- top-level queue ---------------------------------------------------------------

    def cluster_prefix(self, cluster: str) -> bytes:
        # (root, "c", cluster): every shard of one top-level queue
        return self._pack("c", cluster)

    def shard_prefix(self, cluster: str, shard: int) -> bytes:
        return self._pack("c", cluster, shard)

    def bad_pointer_key(self, cluster: str, shard: int, pointer_id: str) -> bytes:
        # (root, "m", "bad_pointer", cluster, shard, pointer_id): undecodable, set aside
        return self._pack("m", "bad_pointer", cluster, shard, pointer_id)

    def bad_pointers_range(self, cluster: str) -> Range:
        return tuple_range(self._pack("m", "bad_pointer", cluster))

    def layout_key(self, cluster: str) -> bytes:
        # (root, "m", "layout", cluster): the layout record (layout.py)
        return self._pack("m", "layout", cluster)

    def pointer_key(self, cluster: str, shard: int, pointer_id: str) -> bytes:
        # (root, "c", cluster, shard, "p", pointer_id)
        return _shard_part(self.root, cluster, shard, "p") + _packed_id(pointer_id)

    def pointer_key_around(self, cluster: str, shard: int) -> tuple[bytes, bytes]:
        """(before, after): ``pointer_key(cluster, shard, pointer_id)`` is ``before +
        pointer_id.encode() + after`` for an id with no NUL (every id quick makes: hex),
        so a store can find a pointer's record from its index entry's value."""
        return _shard_part(self.root, cluster, shard, "p") + b"\x02", b"\x00"

    def pointers_range(self, cluster: str, shard: int) -> Range:
        return tuple_range(self._pack("c", cluster, shard, "p"))

    def pointer_vesting_key(
        self, cluster: str, shard: int, vesting_ms: int, pointer_id: str
    ) -> bytes:
        # (root, "c", cluster, shard, "v", vesting, pointer_id)
        return (
            _shard_part(self.root, cluster, shard, "v")
            + _packed_uint(vesting_ms)
            + _packed_id(pointer_id)
        )

    def pointer_vesting_prefix(self, cluster: str, shard: int) -> bytes:
        return _shard_part(self.root, cluster, shard, "v")

    def pointer_vesting_around(
        self, cluster: str, shard: int, pointer_id: str
    ) -> tuple[bytes, bytes]:
        """(before, after): ``pointer_vesting_key(cluster, shard, vesting, pointer_id)`` is
        ``before`` + ``vesting`` packed as an ``fdb.tuple`` integer + ``after``."""
        return _shard_part(self.root, cluster, shard, "v"), _packed_id(pointer_id)

    def pointer_vested_range(self, cluster: str, shard: int, now_ms: int) -> Range:
        """Vesting-index entries with vesting <= ``now_ms``."""
        prefix = self.pointer_vesting_prefix(cluster, shard)
        return prefix + b"\x00", prefix + _packed_uint(now_ms + 1)

    def unpack_pointer_vesting_key(self, cluster: str, shard: int, key: bytes) -> tuple[int, str]:
        prefix = self.pointer_vesting_prefix(cluster, shard)
        return _unpack_uint_and_name(key[len(prefix) :])

    def pointer_index_key(self, cluster: str, shard: int, zone: ZoneId) -> bytes:
        # (root, "c", cluster, shard, "ix", app, tenant): packed from cached pieces, as every
        # enqueue packs it twice (1.3 µs against 8.9 µs for a full pack).
        return _shard_part(self.root, cluster, shard, "ix") + _zone_tail(zone.app, zone.tenant)

    def unpack_pointer_index_key(self, cluster: str, shard: int, key: bytes) -> ZoneId:
        app, tenant = fdbtuple.unpack(key[len(self._pack("c", cluster, shard, "ix")) :])
        return ZoneId(str(app), str(tenant))

    def pointer_index_range(self, cluster: str, shard: int) -> Range:
        return tuple_range(self._pack("c", cluster, shard, "ix"))

    def local_zone(self, cluster: str, shard: int) -> ZoneId:
        """The zone holding a top-level queue's local work items."""
        return ZoneId(LOCAL_APP, f"{cluster}/{shard}")

    # --- dead letters and metadata -----------------------------------------------------

    def dead_letter_key(self, zone: ZoneId, item_id: str) -> bytes:
        # (root, "d", app, tenant, item_id)
        return self._pack("d", zone.app, zone.tenant, item_id)

    def dead_letter_chunk_key(self, zone: ZoneId, item_id: str, n: int) -> bytes:
        # (root, "d", app, tenant, item_id, n)
        return self._pack("d", zone.app, zone.tenant, item_id, n)

    def dead_letter_range_of(self, zone: ZoneId, item_id: str) -> Range:
        """A dead letter's record and all its chunks."""
        key = self.dead_letter_key(zone, item_id)
        return key, key + b"\xff"

    def dead_letters_range(self, app: str | None = None) -> Range:
        """Every dead letter, or one app's. A tenant is not a key prefix on its own: callers
        filtering by tenant filter the keys of this range (admin.list_dead_letters)."""
        parts: list[object] = ["d"]
        if app is not None:
            parts.append(app)
        return tuple_range(self._pack(*parts))

    def dead_letters_zone_range(self, zone: ZoneId) -> Range:
        return tuple_range(self._pack("d", zone.app, zone.tenant))

    # --- outcomes of finished items ----------------------------------------------------

    def outcome_key(self, zone: ZoneId, item_id: str) -> bytes:
        # (root, "o", app, tenant, item_id)
        return self._pack("o", zone.app, zone.tenant, item_id)

    def outcomes_range(self) -> Range:
        return tuple_range(self._pack("o"))

    def outcome_expiry_key(self, expires_ms: int, zone: ZoneId, item_id: str) -> bytes:
        # (root, "oe", expires_ms, app, tenant, item_id)
        return self._pack("oe", expires_ms, zone.app, zone.tenant, item_id)

    def outcome_expiry_range(self, now_ms: int) -> Range:
        """Expiry entries with expires_ms <= ``now_ms``, oldest first."""
        return self._pack("oe") + b"\x00", self._pack("oe", now_ms + 1)

    def unpack_outcome_expiry_key(self, key: bytes) -> tuple[int, str, str, str]:
        expires, app, tenant, item_id = self.unpack(key)[1:]
        assert isinstance(expires, int)
        return expires, str(app), str(tenant), str(item_id)

    # --- flow keys: idempotency and debounce keys (flow_keys.py) -------------------------

    def flow_key(self, zone: ZoneId, kind: str, key: str) -> bytes:
        # (root, "k", app, tenant, kind, key)
        return self._pack("k", zone.app, zone.tenant, kind, key)

    def flow_wait_key(self, zone: ZoneId, key: str, seq: int) -> bytes:
        # (root, "k", app, tenant, "w", key, seq) -> item_id: waiting for a one-at-a-time key
        return self._pack("k", zone.app, zone.tenant, "w", key, seq)

    def flow_wait_range(self, zone: ZoneId, key: str) -> Range:
        """A one-at-a-time key's waiting items, in enqueue order."""
        return tuple_range(self._pack("k", zone.app, zone.tenant, "w", key))

    def flow_keys_range(self, zone: ZoneId | None = None) -> Range:
        """Every flow key record, or one zone's."""
        if zone is None:
            return tuple_range(self._pack("k"))
        return tuple_range(self._pack("k", zone.app, zone.tenant))

    def flow_expiry_key(self, expires_ms: int, zone: ZoneId, kind: str, key: str) -> bytes:
        # (root, "ke", expires_ms, app, tenant, kind, key)
        return self._pack("ke", expires_ms, zone.app, zone.tenant, kind, key)

    def flow_expiry_range(self, now_ms: int) -> Range:
        """Expiry entries with expires_ms <= ``now_ms``, oldest first."""
        return self._pack("ke") + b"\x00", self._pack("ke", now_ms + 1)

    def unpack_flow_expiry_key(self, key: bytes) -> tuple[int, ZoneId, str, str]:
        expires, app, tenant, kind, name = self.unpack(key)[1:]
        assert isinstance(expires, int)
        return expires, ZoneId(str(app), str(tenant)), str(kind), str(name)

    # --- batches (store/batches.py) ----------------------------------------------------

    def batch_key(self, app: str, batch_id: str) -> bytes:
        # (root, "b", app, batch_id, "r"): the batch's record (counts, callback)
        return self._pack("b", app, batch_id, "r")

    def batch_member_key(self, app: str, batch_id: str, tenant: str, item_id: str) -> bytes:
        # (root, "b", app, batch_id, "m", tenant, item_id): an item not yet finished
        return self._pack("b", app, batch_id, "m", tenant, item_id)

    def batch_zone_key(self, app: str, batch_id: str, tenant: str) -> bytes:
        # (root, "b", app, batch_id, "t", tenant): the zone's members not yet finished
        return self._pack("b", app, batch_id, "t", tenant)

    def batch_count_key(self, app: str, batch_id: str, state: str) -> bytes:
        # (root, "b", app, batch_id, "n", state): items finished so, by atomic add
        return self._pack("b", app, batch_id, "n", state)

    def batch_failed_key(self, app: str, batch_id: str, tenant: str, item_id: str) -> bytes:
        # (root, "b", app, batch_id, "f", tenant, item_id): an item that did not complete
        return self._pack("b", app, batch_id, "f", tenant, item_id)

    def batch_range(self, app: str, batch_id: str) -> Range:
        """Every key of one batch."""
        return tuple_range(self._pack("b", app, batch_id))

    def batch_expiry_key(self, expires_ms: int, app: str, batch_id: str) -> bytes:
        # (root, "be", expires_ms, app, batch_id): a finished batch's keys go then
        return self._pack("be", expires_ms, app, batch_id)

    def batch_expiry_range(self, now_ms: int) -> Range:
        """Expiry entries with expires_ms <= ``now_ms``, oldest first."""
        return self._pack("be") + b"\x00", self._pack("be", now_ms + 1)

    def unpack_batch_expiry_key(self, key: bytes) -> tuple[str, str]:
        _, app, batch_id = self.unpack(key)[1:]
        return str(app), str(batch_id)

    def batch_failed_range(self, app: str, batch_id: str) -> Range:
        return tuple_range(self._pack("b", app, batch_id, "f"))

    def unpack_batch_failed_key(self, key: bytes) -> tuple[str, str]:
        tenant, item_id = self.unpack(key)[4:]
        return str(tenant), str(item_id)

    def meta_key(self, *name: object) -> bytes:
        # (root, "m", name...): settings, counters and summaries, looked up on every visit
        # and written per tenant by each pickup flush; packed piece by piece (the prefix
        # cached, text and integers by hand) at a fifth of fdb.tuple's cost.
        return _meta_head(self.root) + b"".join(map(_packed_part, name))

    def meta_range(self, *name: object) -> Range:
        return tuple_range(self.meta_key(*name))

    @staticmethod
    def extend(key: bytes, *name: object) -> bytes:
        # A packed tuple extended by more elements (a flat tuple's packing is its
        # elements' packings concatenated): the same bytes as packing it all again,
        # without repacking a prefix many keys share.
        return key + b"".join(map(_packed_part, name))

    def everything(self) -> Range:
        prefix = _tup(self.root)
        return prefix, strinc(prefix)


def shard_of(zone: ZoneId, shards: int) -> int:
    """Stable hash of (app, tenant) to a shard, identical across processes and releases."""
    if shards <= 1:
        return 0
    digest = zlib.crc32(f"{zone.app}\x00{zone.tenant}".encode())
    return digest % shards

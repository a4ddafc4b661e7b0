"""The key layout is exactly fdb.tuple's encoding of the documented tuples, however the
keys are assembled (cached prefixes and ids, hand-placed versionstamps)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from quickzones.store.keys import KeySpace
from quickzones.store.records import ZoneId
from quickzones.store.tuple_layer import fdbtuple

names = st.text(min_size=1, max_size=40)  # any unicode, NUL bytes included
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(root=names, app=names, tenant=names, item_id=names, priority=ints, vesting=ints)
def test_zone_keys_are_the_documented_tuples(
    root: str, app: str, tenant: str, item_id: str, priority: int, vesting: int
) -> None:
    keys, zone = KeySpace(root), ZoneId(app, tenant)
    base = (root, "z", app, tenant)
    assert keys.item_key(zone, item_id) == fdbtuple.pack((*base, "i", item_id))
    assert keys.item_chunk_key(zone, item_id, 3) == fdbtuple.pack((*base, "i", item_id, 3))
    assert keys.order_key(zone, priority, vesting, item_id) == fdbtuple.pack(
        (*base, "x", priority, vesting, item_id)
    )
    assert keys.count_key(zone) == fdbtuple.pack((*base, "n"))
    # The ranges a dequeue and a requeue read, concatenated from cached packings.
    head = fdbtuple.pack((*base, "x", priority))
    assert keys.order_priority_start(zone, priority) == head
    assert keys.order_priority_range(zone, priority, vesting) == (
        head + b"\x00",
        fdbtuple.pack((*base, "x", priority, vesting + 1)),
    )
    assert keys.fifo_range(zone, priority) == (head + b"\x33", head + b"\x34")
    assert keys.unpack_order_key(zone, keys.order_key(zone, priority, vesting, item_id)) == (
        priority,
        vesting,
        item_id,
    )


@given(
    app=names,
    tenant=names,
    item_id=names,
    priority=ints,
    stamp=st.binary(min_size=10, max_size=10),
    seq=st.integers(min_value=0, max_value=2**63),
)
def test_fifo_keys_hold_a_tuple_versionstamp(
    app: str, tenant: str, item_id: str, priority: int, stamp: bytes, seq: int
) -> None:
    keys, zone = KeySpace(), ZoneId(app, tenant)
    key = keys.fifo_key(zone, priority, stamp, seq, item_id)
    parts = fdbtuple.unpack(key)
    assert parts[:6] == ("quick", "z", app, tenant, "x", priority)
    assert parts[6] == fdbtuple.Versionstamp(stamp, 0) and parts[7:] == (seq, item_id)
    assert keys.unpack_order_key(zone, key) == (priority, None, item_id)
    begin, end = keys.fifo_range(zone, priority)
    assert begin <= key < end
    # After every vesting-keyed entry of its priority, before the next priority.
    assert keys.order_key(zone, priority, 2**63 - 1, "\U0010ffff" * 3) < key
    assert key < keys.order_priority_start(zone, priority + 1)
    # The template fills to the same key, with the stamp where its offset says.
    template = keys.fifo_key_template(zone, priority, seq, item_id)
    body, offset = template[:-4], int.from_bytes(template[-4:], "little")
    assert body[:offset] + stamp + body[offset + 10 :] == key


@given(root=names, cluster=names, shard=ints, pointer_id=names, vesting=ints)
def test_pointer_keys_are_the_documented_tuples(
    root: str, cluster: str, shard: int, pointer_id: str, vesting: int
) -> None:
    keys = KeySpace(root)
    base = (root, "c", cluster, shard)
    assert keys.pointer_key(cluster, shard, pointer_id) == fdbtuple.pack((*base, "p", pointer_id))
    vesting_key = keys.pointer_vesting_key(cluster, shard, vesting, pointer_id)
    assert vesting_key == fdbtuple.pack((*base, "v", vesting, pointer_id))
    assert keys.pointer_vesting_prefix(cluster, shard) == fdbtuple.pack((*base, "v"))
    assert keys.unpack_pointer_vesting_key(cluster, shard, vesting_key) == (vesting, pointer_id)
    begin, end = keys.pointer_vested_range(cluster, shard, vesting)
    assert begin <= vesting_key < end
    assert keys.pointer_vesting_key(cluster, shard, vesting + 1, pointer_id) >= end
    zone = ZoneId(pointer_id, root)
    assert keys.pointer_index_key(cluster, shard, zone) == fdbtuple.pack(
        (*base, "ix", zone.app, zone.tenant)
    )
    assert (
        keys.unpack_pointer_index_key(cluster, shard, keys.pointer_index_key(cluster, shard, zone))
        == zone
    )


def test_pointer_keys_of_real_shapes() -> None:
    """The hand-packed path: a store-clock millisecond and a hex pointer id."""
    keys = KeySpace()
    for vesting in (0, 1, 255, 256, 1_700_000_000_123, 2**63 - 1, 2**64 - 1, -5):
        key = keys.pointer_vesting_key("default", 3, vesting, "9f3a0c1d2e4b5a69")
        assert key == fdbtuple.pack(("quick", "c", "default", 3, "v", vesting, "9f3a0c1d2e4b5a69"))
        assert keys.unpack_pointer_vesting_key("default", 3, key) == (vesting, "9f3a0c1d2e4b5a69")

"""What a one-item zone's visit writes (issue 43 case 3): 100,000 tenants with one item
each drained at under half a lone tenant's rate, a visit per item. Inside a
one-transaction visit the pointer's lease was written (its record, its vesting entry
moved to the lease's end) and then overwritten by the requeue in the same transaction,
which nothing outside it could see: the record was written twice and the vesting index
three times. Now the requeue writes the pointer once, from the record the lease read."""

from __future__ import annotations

from collections.abc import Callable

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId

ZONE = ZoneId("app", "one")


def _pointer_writes(q: Quick, shard: int) -> list[tuple[str, bytes]]:
    """From now on, each set and clear of a key of ``shard``'s pointer records and
    vesting index, in order."""
    cluster = q.toplevel.cluster
    records = q.keys.pointers_range(cluster, shard)
    vesting = q.keys.pointer_vesting_prefix(cluster, shard)
    writes: list[tuple[str, bytes]] = []
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        tr = real()
        set_: Callable[[bytes, bytes], None] = tr.set
        clear: Callable[[bytes], None] = tr.clear

        def ours(key: bytes) -> bool:
            return records[0] <= key < records[1] or key.startswith(vesting)

        def counted_set(key: bytes, value: bytes) -> None:
            if ours(key):
                writes.append(("set", key))
            set_(key, value)

        def counted_clear(key: bytes) -> None:
            if ours(key):
                writes.append(("clear", key))
            clear(key)

        tr.set = counted_set  # type: ignore[method-assign]
        tr.clear = counted_clear  # type: ignore[method-assign]
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return writes


def test_a_one_item_zone_visit_writes_its_pointer_once(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)
    q.enqueue("job", b"", app=ZONE.app, tenant=ZONE.tenant)
    before = q.toplevel.get_pointer(ZONE)
    assert before is not None
    shard = q.toplevel.shard_for(ZONE)
    consumer = q.consumer(ConsumerConfig(workers=4, one_transaction_visits=True))
    refs = consumer.scan_once()
    writes = _pointer_writes(q, shard)
    works = consumer.visit_many(refs)
    assert [w.item.payload for w in works] == [b""]
    after = q.toplevel.get_pointer(ZONE)
    assert after is not None and after.lease_id is None
    assert after.vesting_ms > before.vesting_ms  # the item's lease: vesting at its end
    cluster = q.toplevel.cluster
    old = q.keys.pointer_vesting_key(cluster, shard, before.vesting_ms, before.pointer_id)
    new = q.keys.pointer_vesting_key(cluster, shard, after.vesting_ms, after.pointer_id)
    record = q.keys.pointer_key(cluster, shard, before.pointer_id)
    # Before: clear old, set record, set the lease's entry, clear it, set record, set new.
    assert sorted(writes) == sorted([("clear", old), ("set", record), ("set", new)])
    consumer.execute(works[0])
    assert consumer.run_until_idle() == 0
    assert q.zones.count(ZONE) == 0

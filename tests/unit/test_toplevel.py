"""The top-level queue: pointers, the two-part enqueue, pointer GC (invariants 1-3)."""

from __future__ import annotations

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ZoneLeaseFailed
from quickzones.store.kv import KVError, KVTransaction
from quickzones.store.records import ZoneId

Z = ZoneId("app", "t1")


def test_enqueue_creates_one_pointer_per_zone(q: Quick) -> None:
    for _ in range(3):
        q.enqueue("job", b"", app="app", tenant="t1")
    q.enqueue("job", b"", app="app", tenant="t2")
    pointers = q.toplevel.list_pointers(0)
    assert sorted(p.zone.tenant for p in pointers) == ["t1", "t2"]


def test_pointer_pulled_earlier_by_part_two(q: Quick, clock: ManualClock) -> None:
    q.enqueue("job", b"", app="app", tenant="t1", delay=100)
    assert q.toplevel.get_pointer(Z).vesting_ms == int(clock.now() * 1000) + 100_000  # type: ignore[union-attr]
    q.enqueue("job", b"", app="app", tenant="t1", delay=1)
    assert q.toplevel.get_pointer(Z).vesting_ms == int(clock.now() * 1000) + 1_000  # type: ignore[union-attr]
    assert q.toplevel.peek_pointers(0, 10) == []
    clock.advance(1)
    assert len(q.toplevel.peek_pointers(0, 10)) == 1


def test_user_transaction_abort_leaves_no_item_and_no_pointer(q: Quick) -> None:
    class Abort(Exception):
        pass

    def body(tr: KVTransaction) -> None:
        tr.set(b"user/1", b"alice")
        q.enqueue("job", b"welcome", app="app", tenant="t1", tr=tr)
        raise Abort

    with pytest.raises(Abort):
        q.transact(body)
    assert q.zones.count(Z) == 0
    assert q.toplevel.get_pointer(Z) is None
    assert q.transact(lambda tr: tr.get(b"user/1")) is None


def test_user_transaction_commits_data_and_item_together(q: Quick) -> None:
    def body(tr: KVTransaction) -> str:
        tr.set(b"user/1", b"alice")
        return q.enqueue("job", b"welcome", app="app", tenant="t1", tr=tr)

    item_id = q.transact(body)
    assert q.transact(lambda tr: tr.get(b"user/1")) == b"alice"
    assert q.get("app", "t1", item_id) is not None
    assert q.toplevel.get_pointer(Z) is not None


def test_pointer_lease_never_aborts_a_user_enqueue(q: Quick) -> None:
    """Invariant 3: the enqueue reads the pointer index, the lease writes the record."""
    q.enqueue("job", b"first", app="app", tenant="t1")
    user = q.kv.create_transaction()
    user.get_read_version()
    q.enqueue("job", b"second", app="app", tenant="t1", tr=user)
    [ref] = q.toplevel.peek_pointers(0, 10)
    q.toplevel.obtain_pointer_lease(ref, 1_000)  # a consumer commits its lease meanwhile
    user.commit()  # must not raise not_committed
    assert q.zones.count(Z) == 2


def test_concurrent_pointer_leases_one_wins(q: Quick) -> None:
    q.enqueue("job", b"", app="app", tenant="t1")
    [ref] = q.toplevel.peek_pointers(0, 10)
    q.toplevel.obtain_pointer_lease(ref, 1_000)
    with pytest.raises(ZoneLeaseFailed) as err:
        q.toplevel.obtain_pointer_lease(ref, 1_000)
    assert err.value.reason == "moved"


def test_pointer_collected_after_min_inactive(q: Quick, clock: ManualClock) -> None:
    q.enqueue("job", b"", app="app", tenant="t1")
    q.job("job")(lambda payload, ctx: None)
    consumer = q.consumer(ConsumerConfig(in_order=True, min_inactive_s=5, item_lease_s=2))
    assert consumer.run_until_idle() == 1
    # The pointer was requeued at the item's lease end, before the item completed.
    clock.advance(2.01)
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(Z) is not None  # empty, but not for min_inactive yet
    clock.advance(5.01)
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(Z) is None
    assert q.toplevel.count_pointers(0) == 0
    # A new enqueue recreates it (invariant 1).
    q.enqueue("job", b"", app="app", tenant="t1")
    assert q.toplevel.get_pointer(Z) is not None


def test_pointer_delete_conflicts_with_racing_enqueue(q: Quick, clock: ManualClock) -> None:
    """Invariant 2: the deleting transaction read the zone and the pointer index."""
    q.enqueue("job", b"", app="app", tenant="t1")
    q.job("job")(lambda payload, ctx: None)
    consumer = q.consumer(ConsumerConfig(in_order=True, min_inactive_s=1, item_lease_s=1))
    consumer.run_until_idle()
    clock.advance(2.01)
    [ref] = q.toplevel.peek_pointers(0, 10)
    pointer = q.toplevel.obtain_pointer_lease(ref, 1_000)
    raced = {"done": False}

    def zone_is_empty(tr: KVTransaction) -> bool:
        empty = q.zones.zone_is_empty(tr, Z)
        if not raced["done"]:
            raced["done"] = True
            q.enqueue("job", b"late", app="app", tenant="t1")  # commits in between
        return empty

    outcome = q.toplevel.requeue_pointer(
        pointer,
        lambda tr: q.zones.min_vesting_ms(Z, tr=tr),
        zone_is_empty,
        min_inactive_ms=1_000,
        active=False,
    )
    assert outcome == "requeued"  # the retry saw the new item
    assert q.toplevel.get_pointer(Z) is not None
    assert consumer.run_until_idle() == 1


def test_sharded_top_level_queue(backend: str, tmp_path, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import store_url

    q = Quick.open(store_url(backend, tmp_path), clock=clock, shards=4)
    seen = []
    q.job("job")(lambda payload, ctx: seen.append(ctx.tenant))
    for i in range(40):
        q.enqueue("job", b"", app="app", tenant=f"t{i}")
    per_shard = [q.toplevel.count_pointers(s) for s in range(4)]
    assert sum(per_shard) == 40 and all(n > 0 for n in per_shard)
    assert q.run_until_idle() == 40
    assert sorted(seen) == sorted(f"t{i}" for i in range(40))
    q.close()


def test_kv_error_is_storage_error() -> None:
    err = KVError(1020)
    assert err.retryable and err.name == "not_committed"


def test_local_work_items_live_in_the_top_level_queue(q: Quick) -> None:
    from quickzones.store.tuple_layer import fdbtuple  # fdb.tuple, imported in one place

    ran = []
    q.job("sweep")(lambda payload, ctx: ran.append(payload))
    item_id = q.enqueue_local("sweep", {"what": "gc"})
    zone = q.toplevel.local_zone(0)
    key = q.keys.item_key(zone, item_id)
    assert fdbtuple.unpack(key)[:5] == ("quick", "c", "default", 0, "l")
    assert q.run_until_idle() == 1 and ran == [{"what": "gc"}]


def test_collected_zone_leaves_no_key_behind(q: Quick, clock: ManualClock) -> None:
    q.job("job")(lambda payload, ctx: None)
    for i in range(5):
        q.enqueue("job", b"", app="app", tenant=f"t{i}")
    consumer = q.consumer(ConsumerConfig(in_order=True, min_inactive_s=1, item_lease_s=1))
    consumer.run_until_idle()
    clock.advance(3)
    consumer.run_until_idle()
    assert q.toplevel.count_pointers(0) == 0
    begin, end = q.keys.everything()
    # What stays is the cluster's layout (one record per cluster: issue 40 point 6) and
    # the job type's policy (one record per type), nothing per tenant.
    layout = q.keys.layout_key("default")
    policy = q.keys.meta_key("type_policy", "job")
    assert [k for k, _ in q.transact(lambda tr: tr.get_range(begin, end))] == [layout, policy]


def test_enqueue_racing_a_visit_is_not_stranded_behind_a_lease(q: Quick) -> None:
    """A consumer leases and requeues the zone's pointer (at a leased item's lease end)
    while a user transaction that enqueues into the zone is still open: the new item must
    not wait for that lease to expire. Part two runs after every enqueue into a zone that
    already had a pointer, because nothing part one reads can be trusted at its commit."""
    q.job("job")(lambda payload, ctx: None)
    consumer = q.consumer(ConsumerConfig(in_order=True, item_lease_s=30))
    q.enqueue("job", b"a", app="app", tenant="t1")
    [ref] = consumer.scan_once()
    assert len(consumer.visit(ref)) == 1  # A is leased for 30 s, not run
    q.enqueue("job", b"b", app="app", tenant="t1")  # B pulls the pointer to now

    def user(tr: KVTransaction) -> str:
        item_id = q.enqueue("job", b"c", app="app", tenant="t1", tr=tr)
        # Meanwhile a consumer visits: leases the pointer, takes B, requeues the pointer
        # at the earliest lease end (30 s), all committed before this transaction.
        [ref] = consumer.scan_once()
        assert [w.item.payload for w in consumer.visit(ref)] == [b"b"]
        return item_id

    c_id = q.transact(user)
    [ref] = consumer.scan_once()  # C's pointer is vested now, not in 30 s
    assert [w.item.item_id for w in consumer.visit(ref)] == [c_id]


def test_the_listings_of_apps_and_their_zones_over_shards(  # type: ignore[no-untyped-def]
    backend: str, tmp_path, clock: ManualClock
) -> None:
    """What the HTTP pages list of the top-level queue: the apps with a zone, an app's
    tenants in name order a page at a time (a prefix, a substring), and how many zones an
    app has, exact or capped, over every shard."""
    from tests.conftest import store_url

    q = Quick.open(store_url(backend, tmp_path), clock=clock, shards=3)
    try:
        tenants = sorted(f"t{i:02d}" for i in range(12))
        for t in tenants:
            q.enqueue("job", b"", app="a", tenant=t)
        q.enqueue("job", b"", app="b", tenant="x")

        assert q.toplevel.apps() == {"a", "b"}
        pages, after = [], None
        while True:
            page, after = q.toplevel.zone_page("a", 5, after=after)
            pages.append(page)
            if after is None:
                break
        assert [len(p) for p in pages] == [5, 5, 2]
        assert [t for p in pages for t in p] == tenants
        assert q.toplevel.zone_page("a", 20, prefix="t0")[0] == tenants[:10]
        assert q.toplevel.zone_page("a", 20, contains="1")[0] == ["t01", "t10", "t11"]
        assert q.toplevel.zone_count("a", 100) == (12, True)
        assert q.toplevel.zone_count("a", 12) == (12, True)
        assert q.toplevel.zone_count("a", 7) == (7, False)
        assert q.toplevel.zone_count("nobody", 7) == (0, True)
    finally:
        q.close()

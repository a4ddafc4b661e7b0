"""Zone operations (paper section 5) on every backend, with a manual clock."""

from __future__ import annotations

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import (
    InvalidArgument,
    ItemNotFound,
    ItemNotVested,
    LeaseLost,
    PayloadTooLarge,
)
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.records import ZoneId
from tests.unit.helpers import count_range_rows

Z = ZoneId("app", "t1")


def enqueue(q: Quick, payload: object = b"x", **kw: object) -> str:
    return q.enqueue("job", payload, app=Z.app, tenant=Z.tenant, **kw)  # type: ignore[arg-type]


def test_peek_orders_by_priority_then_vesting(q: Quick, clock: ManualClock) -> None:
    a = enqueue(q, priority=5)
    clock.advance(0.01)
    b = enqueue(q, priority=1)
    clock.advance(0.01)
    c = enqueue(q, priority=1)
    d = enqueue(q, priority=-3, delay=10)  # not vested yet
    e = enqueue(q, priority=5, delay=0)
    assert [i.item_id for i in q.zones.peek(Z, 10)] == [b, c, a, e]
    clock.advance(11)
    assert [i.item_id for i in q.zones.peek(Z, 10)] == [d, b, c, a, e]
    assert [i.item_id for i in q.zones.peek(Z, 2)] == [d, b]


def test_a_zone_of_default_priority_items_reads_its_order_index_once(q: Quick) -> None:
    """A visit to a backlog zone takes its vested entries in one read, and a zone whose
    other items are leased (its own consumer's, running) reads none of their entries."""
    ids = q.enqueue_many("job", range(30), app=Z.app, tenant=Z.tenant)
    reads = count_range_rows(q)
    first = [i.item_id for i in q.zones.peek(Z, 10)]
    assert len(first) == 10 and set(first) <= set(ids)
    assert reads == [10]
    for item_id in set(ids) - set(first[:5]):
        q.zones.obtain_lease(Z, item_id, 60_000)
    reads.clear()
    assert [i.item_id for i in q.zones.peek(Z, 10)] == first[:5]
    assert reads == [5, 0]  # the vested entries; then no FIFO entry nor other priority


def test_lease_moves_vesting_and_expires(q: Quick, clock: ManualClock) -> None:
    item_id = enqueue(q)
    leased = q.zones.obtain_lease(Z, item_id, 5_000)
    assert leased.lease_id and len(leased.lease_id) == 32
    assert q.zones.peek(Z, 10) == []
    with pytest.raises(ItemNotVested):
        q.zones.obtain_lease(Z, item_id, 5_000)
    clock.advance(5.001)  # invariant 5: visible again after expiry
    assert [i.item_id for i in q.zones.peek(Z, 10)] == [item_id]
    again = q.zones.obtain_lease(Z, item_id, 5_000)
    assert again.lease_id != leased.lease_id
    with pytest.raises(LeaseLost):  # invariant 4: the old holder is out
        q.zones.complete(Z, item_id, leased.lease_id)
    q.zones.complete(Z, item_id, again.lease_id)
    with pytest.raises(ItemNotFound):
        q.zones.complete(Z, item_id, again.lease_id)


def test_a_requeued_items_delay_is_never_cut_short(q: Quick, clock: ManualClock) -> None:
    """A nack or retry 50 ms out, given 0.9 ms into a millisecond: the item vests 50 ms
    after the nack or later, never at the truncated millisecond plus 50 (0.9 ms early)."""
    item_id = enqueue(q)
    [item], _ = q.zones.dequeue(Z, 1, 1_000)
    clock.advance(0.0009)
    nacked_at = clock.now()
    requeued = q.zones.requeue(Z, item_id, item.lease_id or "", 50)
    assert requeued.vesting_ms / 1000 >= nacked_at + 0.05
    clock.advance(0.0495)  # 49.5 ms after the nack
    assert q.zones.peek(Z, 1) == []
    clock.advance(0.0015)
    assert [i.item_id for i in q.zones.peek(Z, 1)] == [item_id]


def test_only_holder_extends_and_requeues(q: Quick, clock: ManualClock) -> None:
    item_id = enqueue(q)
    [item], _ = q.zones.dequeue(Z, 1, 1_000)
    assert item.lease_id
    with pytest.raises(LeaseLost):
        q.zones.extend_lease(Z, item_id, "not-the-lease", 1_000)
    with pytest.raises(LeaseLost):
        q.zones.requeue(Z, item_id, "not-the-lease", 0)
    clock.advance(2)  # expired, but nobody leased since: extension still holds
    extended = q.zones.extend_lease(Z, item_id, item.lease_id, 1_000)
    assert extended.vesting_ms == int(clock.now() * 1000) + 1_000
    requeued = q.zones.requeue(Z, item_id, item.lease_id, 3_000, error="boom")
    assert requeued.error_count == 1 and requeued.last_error == "boom"
    assert requeued.lease_id is None
    assert q.zones.peek(Z, 1) == []
    clock.advance(3.001)
    assert q.zones.peek(Z, 1)[0].error_count == 1


def test_dequeue_takes_at_most_max_and_counts(q: Quick) -> None:
    ids = [enqueue(q) for _ in range(7)]
    assert q.zones.count(Z) == 7
    items, corrupt = q.zones.dequeue(Z, 3, 10_000)
    assert len(items) == 3 and not corrupt
    assert {i.item_id for i in items} <= set(ids)
    outcomes = q.zones.complete_many(Z, [(i.item_id, i.lease_id or "") for i in items])
    assert outcomes == [None, None, None]
    assert q.zones.count(Z) == 4


def test_idempotent_enqueue_with_caller_id(q: Quick) -> None:
    assert enqueue(q, item_id="order-42") == "order-42"
    assert enqueue(q, item_id="order-42") == "order-42"  # the same job: a no-op
    # Another payload under the id is another job: refused, not dropped (issue 28, point 8).
    with pytest.raises(DuplicateItemMismatch):
        enqueue(q, b"other", item_id="order-42")
    assert q.zones.count(Z) == 1
    assert q.get(Z.app, Z.tenant, "order-42").payload == b"x"  # type: ignore[union-attr]


def test_cancel_by_id(q: Quick) -> None:
    item_id = enqueue(q)
    q.zones.dequeue(Z, 1, 10_000)
    q.cancel(Z.app, Z.tenant, item_id)  # cancels even a leased item
    assert q.get(Z.app, Z.tenant, item_id) is None
    with pytest.raises(ItemNotFound):
        q.cancel(Z.app, Z.tenant, item_id)


def test_zones_are_isolated(q: Quick) -> None:
    item_id = enqueue(q)
    with pytest.raises(ItemNotFound):
        q.cancel(Z.app, "someone-else", item_id)
    assert q.get(Z.app, Z.tenant, item_id) is not None


def test_json_and_bytes_payloads_and_large_payload_chunks(q: Quick) -> None:
    j = enqueue(q, {"a": [1, 2, "x"]})
    big = bytes(range(256)) * 2000  # 512 KB: split across several keys
    b = enqueue(q, big)
    got = {i.item_id: i for i in q.zones.peek(Z, 10)}
    assert got[j].content_type == "json" and got[j].payload == b'{"a":[1,2,"x"]}'
    assert got[b].payload == big
    item = q.zones.obtain_lease(Z, b, 1_000)
    q.zones.complete(Z, b, item.lease_id)
    assert q.get(Z.app, Z.tenant, b) is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"delay": -1}, InvalidArgument),
        ({"delay": float("nan")}, InvalidArgument),
        ({"delay": 1e12}, InvalidArgument),
        ({"priority": 10**9}, InvalidArgument),
        ({"priority": 1.5}, InvalidArgument),
        ({"item_id": ""}, InvalidArgument),
        ({"item_id": "a\x00b"}, InvalidArgument),
    ],
)
def test_bad_enqueue_arguments_store_nothing(q: Quick, kwargs: dict, error: type) -> None:
    keep = enqueue(q)
    with pytest.raises(error):
        enqueue(q, **kwargs)
    assert q.zones.count(Z) == 1 and q.get(Z.app, Z.tenant, keep) is not None


def test_bad_names_and_payloads(q: Quick) -> None:
    with pytest.raises(InvalidArgument):
        q.enqueue("job", b"", app="", tenant="t")
    with pytest.raises(InvalidArgument):
        q.enqueue("not a job type!", b"", app="a", tenant="t")
    with pytest.raises(InvalidArgument):
        q.enqueue("job", object(), app="a", tenant="t")
    with pytest.raises(PayloadTooLarge):
        q.enqueue("job", b"x" * (q.max_payload + 1), app="a", tenant="t")


def test_peek_cost_does_not_grow_with_delayed_items(q: Quick) -> None:
    for _ in range(300):
        enqueue(q, delay=3600)
    ready = enqueue(q)

    reads = count_range_rows(q)
    assert [i.item_id for i in q.zones.peek(Z, 10)] == [ready]
    assert sum(reads) <= 4, reads


def test_complete_many_after_commit_unknown_result_reports_completed() -> None:
    from quickzones.backends.memory import MemoryStore
    from quickzones.backends.memory.faults import FaultConfig

    clock = ManualClock()
    store = MemoryStore(seed=0, clock=clock)
    q = Quick(store, clock=clock)
    ids = q.enqueue_many("job", [1, 2, 3], app=Z.app, tenant=Z.tenant)
    items, _ = q.zones.dequeue(Z, 10, 60_000)
    cancelled = items[2].item_id
    q.cancel(Z.app, Z.tenant, cancelled)
    # The completion commits, but the client hears commit_unknown_result and retries.
    store.faults = FaultConfig(unknown_result=1.0, unknown_result_applied=1.0)
    outcomes = q.zones.complete_many(Z, [(i.item_id, str(i.lease_id)) for i in items])
    assert store.fault_counts["unknown_result_applied"] == 1
    assert outcomes[:2] == [None, None]  # ours, completed by the first attempt
    assert isinstance(outcomes[2], ItemNotFound)  # gone before we came: not ours
    assert q.zones.count(Z) == 0 and sorted(ids) == sorted(i.item_id for i in items)

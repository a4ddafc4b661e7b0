"""FIFO within a priority by commit versionstamp, on every KV backend."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from quickzones.backends.memory import MemoryStore
from quickzones.backends.memory.faults import FaultConfig
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError, InvalidArgument, ItemNotFound
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.tenant_move import move_tenant
from quickzones.store.tuple_layer import fdbtuple
from tests.unit.helpers import count_range_rows

Z = ZoneId("app", "t1")


def enqueue(q: Quick, payload: object = b"x", **kw: object) -> str:
    return q.enqueue("job", payload, app=Z.app, tenant=Z.tenant, **kw)  # type: ignore[arg-type]


def peek_ids(q: Quick, n: int = 100) -> list[str]:
    return [i.item_id for i in q.zones.peek(Z, n)]


def test_commit_order_beats_skewed_producer_clocks(q: Quick, clock: ManualClock) -> None:
    # A producer whose clock is 10 s behind: by vesting time its items would jump the line.
    behind = Quick(q.kv, clock=ManualClock(clock.now() - 10), fifo=True)
    ahead = Quick(q.kv, clock=clock, fifo=True)
    order = []
    for n in range(6):
        producer = ahead if n % 2 == 0 else behind
        order.append(enqueue(producer, n))
    assert peek_ids(q) == order
    [first], _ = q.zones.dequeue(Z, 1, 60_000)
    assert first.item_id == order[0]

    # The same interleaving without FIFO follows the clocks instead.
    plain_behind = Quick(q.kv, clock=ManualClock(clock.now() - 10))
    z2 = ZoneId("app", "t2")
    a = q.enqueue("job", 1, app=z2.app, tenant=z2.tenant)
    b = plain_behind.enqueue("job", 2, app=z2.app, tenant=z2.tenant)
    assert [i.item_id for i in q.zones.peek(z2, 10)] == [b, a]


def test_items_of_one_transaction_keep_call_order(q: Quick) -> None:
    q.fifo = True
    many = q.enqueue_many("job", range(50), app=Z.app, tenant=Z.tenant)

    def two(tr: KVTransaction) -> list[str]:
        return [enqueue(q, "later-1", tr=tr), enqueue(q, "later-2", tr=tr)]

    later = q.transact(two)
    assert peek_ids(q) == many + later
    assert q.zones.count(Z) == 52


def test_priority_first_then_waited_work_then_commit_order(q: Quick, clock: ManualClock) -> None:
    f1 = enqueue(q, fifo=True)
    retried = enqueue(q, fifo=True)
    f2 = enqueue(q, fifo=True)
    urgent = enqueue(q, fifo=True, priority=-1)
    delayed = enqueue(q, fifo=True, delay=5)  # a delay means vesting time, not FIFO
    assert peek_ids(q) == [urgent, f1, retried, f2]
    leased = q.zones.obtain_lease(Z, retried, 60_000)
    assert leased.commit_order is None  # a lease re-keys the item by vesting time
    q.zones.requeue(Z, retried, str(leased.lease_id), 0)
    clock.advance(6)
    # Work that has waited (a retry, a delayed item) goes before the never-leased items.
    assert peek_ids(q) == [urgent, retried, delayed, f1, f2]
    assert peek_ids(q, 3) == [urgent, retried, delayed]


def test_fifo_items_complete_cancel_and_leave_nothing_behind(q: Quick) -> None:
    a = enqueue(q, fifo=True)
    b = enqueue(q, b"y" * 200_000, fifo=True)  # chunked payload
    c = enqueue(q, {"json": True}, fifo=True)
    stored = q.get(Z.app, Z.tenant, b)
    assert stored is not None and stored.payload == b"y" * 200_000
    assert stored.commit_order is not None and len(stored.commit_order[0]) == 10
    q.cancel(Z.app, Z.tenant, a)  # never leased: its FIFO entry goes with it
    with pytest.raises(ItemNotFound):
        q.cancel(Z.app, Z.tenant, a)
    items, _ = q.zones.dequeue(Z, 10, 60_000)
    assert [i.item_id for i in items] == [b, c]
    assert items[0].payload == b"y" * 200_000
    outcomes = q.zones.complete_many(Z, [(i.item_id, str(i.lease_id)) for i in items])
    assert outcomes == [None, None]
    assert q.zones.count(Z) == 0
    assert q.zones.min_vesting_ms(Z) is None
    assert q.kv.create_transaction().get_range(*q.keys.order_range(Z)) == []


def test_dead_letter_and_requeue_of_a_fifo_item(q: Quick) -> None:
    a = enqueue(q, fifo=True)
    q.zones.dead_letter(Z, a, None, "operator")
    assert q.zones.count(Z) == 0
    [dead] = q.dead_letters(Z.app, Z.tenant)
    assert dead.item is not None and dead.item.commit_order is None
    q.requeue_dead_letter(Z.app, Z.tenant, a)
    assert peek_ids(q) == [a]


def test_duplicate_id_in_one_transaction_is_one_item(q: Quick) -> None:
    def twice(tr: KVTransaction) -> None:
        enqueue(q, 1, item_id="once", fifo=True, tr=tr)
        enqueue(q, 1, item_id="once", fifo=True, tr=tr)

    q.transact(twice)
    assert peek_ids(q) == ["once"]
    assert q.zones.count(Z) == 1
    enqueue(q, 1, item_id="once", fifo=True)  # and across transactions, as always
    assert q.zones.count(Z) == 1


def test_min_vesting_sees_fifo_items(q: Quick, clock: ManualClock) -> None:
    now = int(clock.now() * 1000)
    enqueue(q, delay=30)
    assert q.zones.min_vesting_ms(Z) == now + 30_000
    clock.advance(1)
    enqueue(q, fifo=True)
    assert q.zones.min_vesting_ms(Z) == now + 1_000
    enqueue(q, fifo=True, priority=4)
    assert q.zones.min_vesting_ms(Z) == now + 1_000


def test_fifo_keys_are_tuple_versionstamps(q: Quick) -> None:
    a = enqueue(q, fifo=True)
    b = enqueue(q, fifo=True)
    rows = q.kv.create_transaction().get_range(*q.keys.order_range(Z))
    parts = [fdbtuple.unpack(k) for k, _ in rows]
    assert [p[-1] for p in parts] == [a, b]
    stamps = [p[-3] for p in parts]
    assert all(isinstance(s, fdbtuple.Versionstamp) and s.is_complete() for s in stamps)
    assert stamps[0].tr_version < stamps[1].tr_version  # two commits, increasing


def test_peek_cost_stays_proportional_with_fifo_items(q: Quick) -> None:
    for _ in range(200):
        enqueue(q, delay=3600)
    q.enqueue_many("job", range(200), app=Z.app, tenant=Z.tenant, fifo=True)
    reads = count_range_rows(q)
    assert len(q.zones.peek(Z, 10)) == 10
    # probe + the (empty) vested range + 10 FIFO entries; the 200 delayed items unread.
    assert sum(reads) <= 12, reads


def test_tenant_move_keeps_fifo_items_in_place_to_the_ms(q: Quick, clock: ManualClock) -> None:
    ids = q.enqueue_many("job", range(5), app=Z.app, tenant=Z.tenant, fifo=True)
    target = Quick.open("memory://", clock=clock)
    move_tenant(q, target, Z.app, Z.tenant)
    moved = target.zones.peek(Z, 10)
    assert sorted(i.item_id for i in moved) == sorted(ids)
    assert all(i.commit_order is None for i in moved)
    assert q.zones.count(Z) == 0


def test_commit_unknown_result_retry_writes_the_item_once() -> None:
    clock = ManualClock()
    faults = FaultConfig(unknown_result=0.5, unknown_result_applied=1.0)
    q = Quick(MemoryStore(seed=4, clock=clock, faults=faults), clock=clock, fifo=True)
    ids = [enqueue(q, n) for n in range(30)]
    assert q.kv.fault_counts["unknown_result_applied"] > 0  # type: ignore[attr-defined]
    q.kv.faults = FaultConfig()  # type: ignore[attr-defined]
    assert peek_ids(q) == ids
    assert q.zones.count(Z) == 30


def test_consumer_runs_fifo_items_in_commit_order(q: Quick) -> None:
    q.fifo = True
    ran: list[int] = []

    @q.job("job")
    def record(payload: int, ctx: object) -> None:
        ran.append(payload)

    q.enqueue_many("job", range(20), app=Z.app, tenant=Z.tenant)
    from quickzones.consumer import ConsumerConfig

    q.run_until_idle(ConsumerConfig(in_order=True, workers=1, managers=1, dequeue_max=5))
    assert ran == list(range(20))


def test_bad_fifo_flag_is_refused_and_stores_nothing(q: Quick) -> None:
    with pytest.raises(InvalidArgument, match="fifo"):
        enqueue(q, fifo="yes")
    assert q.zones.count(Z) == 0


def test_cassandra_zones_refuse_fifo() -> None:
    from quickzones.adapters.cassandra.quick import CassandraQuick

    with pytest.raises(ConfigurationError, match="FIFO"):
        CassandraQuick(MemoryStore(), None, None, fifo=True)  # type: ignore[arg-type]


def test_cli_enqueue_fifo(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    runner = CliRunner()
    ids = []
    for n in range(3):
        result = runner.invoke(
            main,
            [
                "enqueue",
                "--store",
                url,
                "--app",
                "a",
                "--tenant",
                "t",
                "--job-type",
                "j",
                "--payload",
                str(n),
                "--fifo",
            ],
        )
        assert result.exit_code == 0, result.output
        ids.append(result.output.strip())
    q = Quick.open(url)
    try:
        items = q.zones.peek(ZoneId("a", "t"), 10)
        assert [i.item_id for i in items] == ids
        assert all(i.commit_order is not None for i in items)
    finally:
        q.close()

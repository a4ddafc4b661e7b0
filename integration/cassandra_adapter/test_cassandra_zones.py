"""CassandraZoneStore against a real Cassandra node (items) and SQLite (pointers).

Covers the paper's external-store protocol (section 6.1): the consumer end to end, an
enqueue racing a pointer deletion, a pointer lease concurrent with an enqueue, a failed
pointer transaction, Cassandra going away mid-run, and a consumer killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.cassandra_adapter.helpers import (
    FAST,
    FlakyWork,
    cassandra_url,
    open_quick,
    pointers,
    wait_for,
)
from integration.cassandra_local import LocalCassandra
from quickzones.adapters.cassandra import CassandraError, CassandraQuick
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError, ItemNotFound, LeaseLost
from quickzones.registry import JobContext
from quickzones.store.kv import TRANSACTION_TIMED_OUT, KVError, KVTransaction
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.zonestore import NewItem

pytest_plugins = ["integration.cassandra_fixtures"]
pytestmark = pytest.mark.cassandra


@pytest.fixture
def url(cassandra_node: LocalCassandra, cassandra_session: Any, cassandra_keyspace: str) -> str:
    return cassandra_url(cassandra_node, cassandra_session, cassandra_keyspace)


@pytest.fixture
def cq(url: str, tmp_path: Path) -> Iterator[CassandraQuick]:
    q = open_quick(url, tmp_path)
    yield q
    q.close()


# --- end to end ---------------------------------------------------------------------------


def test_consumer_runs_cassandra_items_end_to_end(cq: CassandraQuick) -> None:
    work = FlakyWork(cq)
    ids = work.enqueue(50)
    delayed = cq.enqueue("work", {"n": 99}, app="app", tenant="t0", delay=0.5)
    assert cq.count("app", "t0") == 11
    assert pointers(cq) == 5

    stats = work.run_all([*ids, delayed])
    assert work.each_ran_once(ids), work.runs
    assert len(work.failed_once) == len([i for i in range(50) if i % 7 == 0])
    assert sum(cq.count("app", f"t{t}") for t in range(5)) == 0
    assert stats["pointer_deleted"] >= 5


def test_priority_order_leases_and_errors(cq: CassandraQuick) -> None:
    zone = cq.zone("app", "order")
    low = cq.enqueue("job", b"low", app="app", tenant="order", priority=5)
    high = cq.enqueue("job", b"high", app="app", tenant="order", priority=-3)
    later = cq.enqueue("job", b"later", app="app", tenant="order", delay=3600)
    assert [i.item_id for i in cq.items.peek(zone, 10)] == [high, low]

    taken, corrupt = cq.items.dequeue(zone, 10, 10_000)
    assert [i.item_id for i in taken] == [high, low] and not corrupt
    assert cq.items.dequeue(zone, 10, 10_000) == ([], [])  # leased: invisible
    held = taken[0]
    with pytest.raises(LeaseLost):
        cq.items.complete(zone, held.item_id, "not-the-lease")
    extended = cq.items.extend_lease(zone, held.item_id, held.lease_id or "", 20_000)
    assert extended.vesting_ms > held.vesting_ms
    requeued = cq.items.requeue(zone, low, taken[1].lease_id or "", 0, error="boom")
    assert requeued.error_count == 1 and requeued.lease_id is None
    with pytest.raises(LeaseLost):  # released: the old lease id no longer completes it
        cq.items.complete(zone, low, taken[1].lease_id)
    outcomes = cq.items.complete_many(zone, [(held.item_id, held.lease_id or ""), (low, "x")])
    assert outcomes[0] is None and isinstance(outcomes[1], LeaseLost)
    with pytest.raises(ItemNotFound):
        cq.items.complete(zone, held.item_id)
    assert cq.items.min_vesting_ms(zone) == requeued.vesting_ms
    cq.cancel("app", "order", later)
    cq.items.dead_letter(zone, low, None, "no longer wanted")
    assert cq.count("app", "order") == 0
    [dead] = cq.dead_letters("app", "order")
    assert (dead.item_id, dead.reason, dead.item and dead.item.error_count) == (
        low,
        "no longer wanted",
        1,
    )


def test_repair_gives_orphaned_items_a_pointer(
    cq: CassandraQuick, url: str, tmp_path: Path
) -> None:
    """A producer that crashed between its Cassandra write and its pointer transaction
    left an item no pointer leads to; `quick cassandra repair` gives the zone one."""
    from click.testing import CliRunner

    from quickzones.adapters.cassandra.repair import repair_pointers
    from quickzones.cli import main

    zone = cq.zone("app", "orphan")
    cq.enqueue("job", b"has a pointer", app="app", tenant="fine")
    # Step one of the enqueue only: the crash happens before the pointer transaction.
    cq.items._insert_new(zone, cq.items._new_record(NewItem("job", b"orphaned")))
    assert cq.toplevel.get_pointer(zone) is None

    cli = CliRunner().invoke(
        main,
        ["cassandra", "repair", "--items", url, "--dry-run",
         "--pointer-store", f"sqlite:///{tmp_path / 'pointers.db'}"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    assert "app\torphan" in cli.stdout and "would get a pointer" in cli.stderr
    assert cq.toplevel.get_pointer(zone) is None  # a dry run writes nothing

    report = repair_pointers(cq.items)
    assert report.repaired == [zone] and report.zones_checked >= 2
    assert cq.toplevel.get_pointer(zone) is not None
    assert repair_pointers(cq.items).repaired == []  # idempotent
    ran: list[bytes] = []
    cq.job("job")(lambda payload, ctx: ran.append(payload))
    assert cq.run_until_idle() == 2
    assert sorted(ran) == [b"has a pointer", b"orphaned"]


def test_kv_transactions_are_refused(cq: CassandraQuick) -> None:
    zone = cq.zone("app", "t")
    tr = cq.kv.create_transaction()
    with pytest.raises(ConfigurationError, match="KV transaction"):
        cq.items.enqueue(zone, NewItem("job", b""), tr=tr)
    item_id = cq.enqueue("job", b"", app="app", tenant="t")
    with pytest.raises(ConfigurationError, match="not supported"):
        cq.items.complete(zone, item_id, None, tr=tr)
    with pytest.raises(ConfigurationError, match="transactional"):
        cq.job("tx", transactional=True)


def test_enqueue_with_same_id_is_idempotent(cq: CassandraQuick) -> None:
    a = cq.enqueue("job", b"1", app="app", tenant="t", item_id="fixed")
    b = cq.enqueue("job", b"1", app="app", tenant="t", item_id="fixed")
    assert a == b == "fixed"
    # Another job under the queued id is refused, not silently dropped (issue 28 point 8).
    with pytest.raises(DuplicateItemMismatch):
        cq.enqueue("job", b"2", app="app", tenant="t", item_id="fixed")
    assert cq.count("app", "t") == 1
    item = cq.get("app", "t", "fixed")
    assert item is not None and item.payload == b"1"


# --- the pointer protocol ------------------------------------------------------------------


def _leased_pointer_of_empty_zone(cq: CassandraQuick, tenant: str) -> Any:
    """A zone whose only item ran and whose pointer a Manager now holds."""
    zone = cq.zone("app", tenant)
    item_id = cq.enqueue("job", b"", app="app", tenant=tenant)
    cq.items.complete(zone, item_id)
    [ref] = [r for r in cq.toplevel.peek_pointers(0, 100)]
    return cq.toplevel.obtain_pointer_lease(ref, 5000)


def test_enqueue_racing_pointer_deletion_makes_the_deletion_retry(cq: CassandraQuick) -> None:
    """The deletion's strong read finds the zone empty; before it commits, an enqueue writes
    its item and commits its pointer transaction, which declares a write conflict on the
    pointer index key the deletion read. The deletion must abort, retry, see the item and
    requeue the pointer instead."""
    zone = cq.zone("app", "race")
    pointer = _leased_pointer_of_empty_zone(cq, "race")
    checks: list[bool] = []
    racing: list[str] = []

    def zone_is_empty(tr: KVTransaction) -> bool:
        empty = cq.items.zone_is_empty(tr, zone)
        checks.append(empty)
        if not racing:
            racing.append(cq.enqueue("job", b"raced", app="app", tenant="race"))
        return empty

    outcome = cq.toplevel.requeue_pointer(
        pointer,
        lambda tr: cq.items.min_vesting_ms(zone, tr=tr),
        zone_is_empty,
        min_inactive_ms=0,
        active=False,
    )
    assert checks[0] is True  # the first attempt saw the zone empty...
    assert outcome == "requeued"  # ...but could not commit the deletion
    assert cq.toplevel.get_pointer(zone) is not None
    ran: list[str] = []
    cq.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    cq.run_until_idle()
    assert ran == racing


def test_pointer_deletion_then_enqueue_creates_a_new_pointer(cq: CassandraQuick) -> None:
    zone = cq.zone("app", "after")
    pointer = _leased_pointer_of_empty_zone(cq, "after")
    outcome = cq.toplevel.requeue_pointer(
        pointer,
        lambda tr: cq.items.min_vesting_ms(zone, tr=tr),
        lambda tr: cq.items.zone_is_empty(tr, zone),
        min_inactive_ms=0,
        active=False,
    )
    assert outcome == "deleted" and cq.toplevel.get_pointer(zone) is None
    item_id = cq.enqueue("job", b"", app="app", tenant="after")
    assert cq.toplevel.get_pointer(zone) is not None
    ran: list[str] = []
    cq.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    cq.run_until_idle()
    assert ran == [item_id]


def test_pointer_lease_concurrent_with_enqueue_does_not_conflict(cq: CassandraQuick) -> None:
    """A Manager leases the zone's pointer while an enqueue's pointer transaction is open:
    the enqueue read only the pointer index key, so it commits on its first attempt."""
    zone = cq.zone("app", "lease")
    cq.enqueue("job", b"first", app="app", tenant="lease")
    attempts: list[int] = []

    def during_pointer_txn(tr: KVTransaction) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            cq.toplevel.ensure_pointer(tr, zone, 0, declare_conflict=True)  # read it first
            [ref] = cq.toplevel.peek_pointers(0, 10)
            cq.toplevel.obtain_pointer_lease(ref, 5000)

    second = cq.items.enqueue(zone, NewItem("job", b"second"), in_pointer_txn=during_pointer_txn)
    assert len(attempts) == 1, "the enqueue's pointer transaction was retried"
    pointer = cq.toplevel.get_pointer(zone)
    assert pointer is not None and pointer.lease_id is not None  # the lease committed too
    assert cq.get("app", "lease", second) is not None


def test_failed_pointer_transaction_collects_the_item(cq: CassandraQuick) -> None:
    zone = cq.zone("app", "fail")

    def fail(tr: KVTransaction) -> None:
        raise KVError(TRANSACTION_TIMED_OUT, "injected")

    with pytest.raises(KVError, match="injected"):
        cq.items.enqueue(zone, NewItem("job", b"lost", item_id="doomed"), in_pointer_txn=fail)
    assert cq.get("app", "fail", "doomed") is None
    assert cq.count("app", "fail") == 0
    assert cq.toplevel.get_pointer(zone) is None
    ran: list[str] = []
    cq.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    assert cq.run_until_idle() == 0 and ran == []

    # A real failure of the same kind: the app's enqueue rate limit, charged in the pointer
    # transaction. The second enqueue fails and leaves nothing behind.
    from quickzones.store.limits import AppLimits, RateLimited

    cq.set_limits("app", AppLimits(enqueues_per_minute=1))
    cq.enqueue("job", b"ok", app="app", tenant="fail", item_id="kept")
    with pytest.raises(RateLimited):
        cq.enqueue("job", b"over", app="app", tenant="fail", item_id="limited")
    assert cq.get("app", "fail", "limited") is None
    cq.set_limits("app", AppLimits())
    # Re-enqueued, it runs.
    cq.items.enqueue(zone, NewItem("job", b"again", item_id="doomed"))
    cq.run_until_idle()
    assert sorted(ran) == ["doomed", "kept"]


# --- failures of Cassandra and of consumers ------------------------------------------------


def test_cassandra_stopped_mid_run(
    cassandra_node: LocalCassandra, url: str, tmp_path: Path
) -> None:
    if not cassandra_node.controllable:
        pytest.skip("external cluster: not ours to stop")
    q = open_quick(url, tmp_path)
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    @q.job("work")
    def work(payload: Any, ctx: JobContext) -> None:
        time.sleep(0.02)
        with lock:
            runs[ctx.item_id] += 1

    ids = [q.enqueue("work", {"n": i}, app="app", tenant=f"t{i % 4}") for i in range(40)]
    later = [
        q.enqueue("work", {"n": i}, app="app", tenant=f"t{i % 4}", delay=4.0) for i in range(8)
    ]
    consumer = q.consumer(ConsumerConfig(workers=2, managers=2, **{**FAST, "min_inactive_s": 0}))
    consumer.start()
    try:
        wait_for(lambda: len(runs) >= 10, 20, "some items to run")
        cassandra_node.stop()
        pointers_down = pointers(q)
        assert pointers_down >= 4  # every zone still has delayed items
        started = time.monotonic()
        with pytest.raises(CassandraError, match="Cassandra"):
            q.enqueue("work", b"", app="app", tenant="new-zone")
        assert time.monotonic() - started < 15
        assert q.toplevel.get_pointer(q.zone("app", "new-zone")) is None
        time.sleep(1.5)  # managers visit zones, fail their strong reads...
        assert pointers(q) == pointers_down  # ...and delete no pointer
        assert consumer.stats["pointer_deleted"] == 0
        cassandra_node.start()
        cassandra_node.wait_ready()
        wait_for(lambda: set(runs) >= {*ids, *later}, 60, "every item to run after restart")
        wait_for(lambda: pointers(q) == 0, 20, "pointers to be collected")
    finally:
        consumer.stop()
        cassandra_node.ensure_running()
        q.close()
    assert set(runs) == {*ids, *later}


WORKER = textwrap.dedent(
    """
    import pathlib, sys, time
    from quickzones.adapters.cassandra import open_cassandra_quick
    from quickzones.consumer import ConsumerConfig
    q = open_cassandra_quick(sys.argv[1], sys.argv[2])
    marker = pathlib.Path(sys.argv[3])

    @q.job("job")
    def job(payload, ctx):
        with marker.open("a") as f:
            f.write(ctx.item_id + "\\n")
        time.sleep(3600)

    q.consumer(ConsumerConfig(item_lease_s=2.0, idle_sleep_s=0.01, workers=4)).run_forever()
    """
)


def test_consumer_killed_holding_leases(url: str, tmp_path: Path) -> None:
    q = open_quick(url, tmp_path)
    ids = {q.enqueue("job", {"n": i}, app="app", tenant=f"k{i % 2}") for i in range(6)}
    marker = tmp_path / "started"
    pointers = f"sqlite:///{tmp_path / 'pointers.db'}"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url, pointers, str(marker)], env=env)
    try:
        wait_for(
            lambda: marker.exists() and len(marker.read_text().split()) >= 4,
            30,
            "the worker to hold four items",
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    held = set(marker.read_text().split())
    leased = {
        i.item_id
        for t in ("k0", "k1")
        for i in q.items.items(q.zone("app", t))
        if not isinstance(i, Exception) and getattr(i, "lease_id", None)
    }
    assert held <= leased  # the dead worker's leases are still recorded

    done: Counter[str] = Counter()
    q.job("job")(lambda payload, ctx: done.update([ctx.item_id]))
    consumer = q.consumer(ConsumerConfig(**FAST))
    consumer.start()
    try:
        wait_for(lambda: set(done) == ids, 30, "every item, the killed worker's too, to run")
    finally:
        consumer.stop()
        q.close()
    assert all(n == 1 for n in done.values())


def test_dead_letter_keeps_traceback_and_counts_the_holders_failed_run(cq: CassandraQuick) -> None:
    """Issue 12 points 14 and 17: the traceback rides with the dead letter, and a lease
    holder's dead-lettering counts its run, so error count and attempts agree."""
    zone = cq.zone("app", "tb")
    cq.items.enqueue(zone, NewItem("job", b"x"))
    [taken], _ = cq.items.dequeue(zone, 1, 10_000)
    cq.items.dead_letter(
        zone, taken.item_id, taken.lease_id, "RuntimeError: boom", traceback="TB\n"
    )
    [dead] = cq.dead_letters("app", "tb")
    assert dead.traceback == "TB\n" and dead.item is not None
    assert dead.item.attempts == dead.item.error_count == 1
    assert dead.item.last_error == "RuntimeError: boom" and "_traceback" not in dead.item.meta

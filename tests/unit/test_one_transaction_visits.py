"""One commit per visit (``ConsumerConfig.one_transaction_visits``): where the zones live in
the pointers' KV store, a Manager's pointer lease, dequeue and requeue commit together.

What a user relies on must not change with it: every item runs once, a visit still takes
at most ``dequeue_max`` (invariant 7), an empty zone's pointer is still collected, routing
and app limits still hold; and a visit that fails leaves nothing leased behind it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.visit_gate import OneTransactionGate
from quickzones.errors import StorageError
from quickzones.store.limits import AppLimits
from quickzones.store.records import WorkItem, ZoneId

# A bound above dequeue_max: the visit, not the bound, is what is measured.
ONE = ConsumerConfig(  # the paper's visits: at most dequeue_max (visit_max)
    in_order=True,
    dequeue_max=10,
    visit_max=10,
    one_transaction_visits=True,
    processing_bound=20,
    # It scans again while holding the visit's 10 items: no zone is passed over for them.
    skip_held_zones_at=100,
)


class _Versions:
    """Counts the store's commits: the read version moves once per commit."""

    def __init__(self, q: Quick) -> None:
        self.q = q

    def now(self) -> int:
        tr = self.q.kv.create_transaction()
        try:
            return int(tr.get_read_version())
        finally:
            tr.cancel()


def test_a_visit_commits_once_and_takes_at_most_dequeue_max(q: Quick, backend: str) -> None:
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    ids = [q.enqueue("j", n, app="app", tenant="t1") for n in range(12)]
    consumer = q.consumer(ONE)
    [ref] = consumer.scan_once()
    versions = _Versions(q)
    before = versions.now()

    works = consumer.manager.visit(ref)

    assert len(works) == 10  # invariant 7
    if backend != "fdb":  # a real cluster's versions advance with time
        assert versions.now() - before == 1
    # Requeued in the same commit at the zone's minimum vesting time: the two left vest now.
    assert [r.pointer_id for r in consumer.scan_once()] == [ref.pointer_id]
    for w in works:
        consumer.execute(w)
    consumer.flush_completions()
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}


def test_many_zones_drain_once_each_with_one_transaction_visits(q: Quick) -> None:
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    ids = [q.enqueue("j", n, app="app", tenant=f"t{n % 7}") for n in range(60)]
    events: list[tuple[str, dict[str, Any]]] = []
    consumer = q.consumer(ONE, observer=lambda event, fields: events.append((event, fields)))
    consumer.run_until_idle()
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}
    assert all(f["items"] <= 10 for e, f in events if e == "visited")
    assert (
        Counter(e for e, _ in events)["pointer_leased"] == Counter(e for e, _ in events)["visited"]
    )


def test_an_empty_zone_pointer_is_still_collected(q: Quick, clock: ManualClock) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="app", tenant="t1")
    consumer = q.consumer(ONE)
    consumer.run_until_idle()
    zone = ZoneId("app", "t1")
    assert q.toplevel.get_pointer(zone) is not None
    # Requeued at the leased item's expiry; by then empty for longer than min_inactive.
    clock.advance(ONE.item_lease_s + 1)
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(zone) is None


def test_a_failed_visit_leaves_nothing_leased(q: Quick) -> None:
    """Nothing of a visit that fails commits: its pointer is vested for the next scan at
    once and its items are untouched (no attempt counted, no lease). The error reaches the
    scanner, as the three transactions' do, so it backs off before the next visit."""
    q.job("j")(lambda payload, ctx: None)
    item_id = q.enqueue("j", 1, app="app", tenant="t1")
    consumer = q.consumer(ONE)

    def failing_accept(reserved: dict[str, str]) -> Any:
        def accept(item: WorkItem) -> bool:
            raise StorageError("disk went away")

        return accept

    consumer.manager.accept_factory = failing_accept
    [ref] = consumer.scan_once()
    with pytest.raises(StorageError, match="disk went away"):
        consumer.manager.visit(ref)
    assert [r.pointer_id for r in consumer.scan_once()] == [ref.pointer_id]  # still vested
    item = q.items.get(ZoneId("app", "t1"), item_id)
    assert item is not None and item.lease_id is None and item.attempts == 0
    assert consumer.in_flight() == 0


def test_routing_refuses_a_pointer_without_writing(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="other", tenant="t1")
    routed = ConsumerConfig(in_order=True, one_transaction_visits=True, apps=("mine",))
    consumer = q.consumer(routed)
    assert consumer.run_until_idle() == 0
    assert q.items.get(ZoneId("other", "t1"), "x") is None
    assert len(q.consumer(ONE).scan_once()) == 1  # the other app's pointer still vested


def test_app_concurrency_cap_holds_with_one_transaction_visits(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)
    q.set_limits("app", AppLimits(max_concurrency=3))
    for i in range(10):
        q.enqueue("job", b"", app="app", tenant=f"t{i}")
    config = ConsumerConfig(in_order=True, dequeue_max=2, one_transaction_visits=True)
    a = q.consumer(config, name="a")
    b = q.consumer(config, name="b")
    held = []
    for consumer in (a, b, a, b):
        for ref in consumer.scan_once():
            held += consumer.visit(ref)
    assert len(held) == 3  # the pool holds at most 3 of the app's items at once


@pytest.mark.parametrize("one", [False, True])
def test_job_type_cap_with_and_without_one_transaction_visits(q: Quick, one: bool) -> None:
    q.job("limited", max_concurrency=2)(lambda payload, ctx: None)
    for n in range(6):
        q.enqueue("limited", n, app="app", tenant="t1")
    consumer = q.consumer(ConsumerConfig(in_order=True, one_transaction_visits=one))
    [ref] = consumer.scan_once()
    assert len(consumer.manager.visit(ref)) == 2
    assert consumer.manager.in_flight.per_type["limited"] == 2


def test_a_conflicting_visit_falls_back_to_three_transactions_at_once(
    q: Quick, clock: ManualClock
) -> None:
    """An enqueue into the zone commits while the visit's transaction is open: its commit
    conflicts, and instead of a retry after a backoff the visit takes the paper's three
    transactions straight away and still hands the items out."""
    q.job("j")(lambda payload, ctx: None)
    first = q.enqueue("j", 1, app="app", tenant="t1")
    consumer, events, raced = _racing_consumer(q, "t1")
    [ref] = consumer.scan_once()
    works = consumer.manager.visit(ref)

    assert "one_transaction_visit_conflict" in events
    assert {w.item.item_id for w in works} == {first, *raced}
    assert consumer.in_flight() == 2
    # Competing for the zone: its next visits take the three transactions...
    gate = consumer.manager.one_transaction
    key = works[0].pointer_key
    assert not any(gate.try_one(key) for _ in range(100))
    # ...for a stretch of time, not of visits: a burst of enqueues into one tenant's zone
    # made three-transaction visits (three commits a zone: on PostgreSQL, whose commits
    # queue on one lock, 40-90 ms for a batch of four zones) the rule for the next
    # hundreds of visits, long after the burst, and small tenants' pickups waited on them.
    clock.advance(gate.first_hold_s)
    assert gate.try_one(key)


def test_a_busy_zones_conflicts_leave_the_other_zones_one_transaction(q: Quick) -> None:
    """``quick demo``: a noisy tenant's producer enqueues every few ms, its zone's visits
    conflict with those enqueues, and each conflict put every zone the consumer visited
    on three transactions (three commits each) for 10 ms or more: the small tenants'
    visits, batched behind the noisy one's, took 15-25 ms. The conflict holds the zone
    that conflicted, and only it."""
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="app", tenant="noisy")
    consumer, events, raced = _racing_consumer(q, "noisy")
    [noisy] = consumer.scan_once()
    noisy_works = consumer.manager.visit(noisy)
    assert "one_transaction_visit_conflict" in events and raced  # raced once, no more

    small = q.enqueue("j", 3, app="app", tenant="small")
    [ref] = [r for r in consumer.scan_once() if r.pointer_id != noisy.pointer_id]
    commits = _count_commits(q)
    works = consumer.manager.visit(ref)
    assert [w.item.item_id for w in works] == [small]
    assert commits() == 1, "the small zone's visit took three transactions"
    gate = consumer.manager.one_transaction
    assert not gate.try_one(noisy_works[0].pointer_key)
    assert gate.try_one(works[0].pointer_key)


def test_a_zone_that_conflicted_lately_is_not_batched_with_the_others(
    q: Quick, clock: ManualClock
) -> None:
    """``quick demo``: once the noisy tenant's hold on three transactions ran out, its
    zone was batched again with small tenants' zones, and its producer's next enqueue
    wrote the whole batch off, twice, before each zone went on its own: one small item
    in twenty waited for two transactions done for nothing (the p95-p99 of their
    pickups). A zone whose visit conflicted lately gets a transaction of its own; the
    other zones of the batch commit together on their first try."""
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="app", tenant="noisy")
    events: list[tuple[str, dict[str, Any]]] = []
    consumer = q.consumer(ONE, observer=lambda event, fields: events.append((event, fields)))
    default_accept = consumer.manager.accept_factory
    races: list[str] = []

    def racing_accept(reserved: dict[str, str]) -> Any:
        inner = default_accept(reserved)

        def accept(item: WorkItem) -> bool:
            # The noisy tenant's producer commits into its zone during each of its visits
            # (its items' payloads are 1 and 2, the small tenants' 3).
            if item.payload in (b"1", b"2") and len(races) < 4:
                races.append(q.enqueue("j", 2, app="app", tenant="noisy"))
            return inner(item)

        return accept

    consumer.manager.accept_factory = racing_accept
    [noisy] = consumer.scan_once()
    consumer.manager.visit(noisy)
    assert races, "the noisy zone's visit did not race its producer"
    gate = consumer.manager.one_transaction
    noisy_key = ("default", noisy.shard, noisy.pointer_id)
    clock.advance(ONE_HOLD_RUNS_OUT_S)
    assert gate.try_one(noisy_key), "the noisy zone's hold on three transactions ran out"

    smalls = [q.enqueue("j", 3, app="app", tenant=t) for t in ("small-a", "small-b")]
    refs = consumer.scan_once()
    by_id = {r.pointer_id: r for r in refs}
    ordered = [by_id.pop(noisy.pointer_id), *by_id.values()]  # the noisy zone first
    assert len(ordered) == 3
    events.clear()
    works = consumer.manager.visit_many(ordered)

    assert set(smalls) <= {w.item.item_id for w in works}
    first = [f for e, f in events if e in ("visits_batched", "one_transaction_visit_conflict")]
    assert first and first[0].get("zones") == 2, (
        f"the small zones' batch was written off by the noisy zone's conflict: {events}"
    )


# How long after a first conflict a zone's hold on three transactions has run out.
ONE_HOLD_RUNS_OUT_S = 0.011


def _racing_consumer(q: Quick, tenant: str) -> tuple[Any, list[str], list[str]]:
    """A one-transaction consumer of ``q`` whose first dequeue, inside its transaction,
    enqueues one item into ``tenant``'s zone (committed before the visit's commit: a
    conflict); returns it, the events it emits and the id of the item that raced."""
    events: list[str] = []
    consumer = q.consumer(ONE, observer=lambda event, fields: events.append(event))
    default_accept = consumer.manager.accept_factory
    raced: list[str] = []

    def racing_accept(reserved: dict[str, str]) -> Any:
        inner = default_accept(reserved)

        def accept(item: WorkItem) -> bool:
            if not raced:
                raced.append(q.enqueue("j", 2, app="app", tenant=tenant))
            return inner(item)

        return accept

    consumer.manager.accept_factory = racing_accept
    return consumer, events, raced


def _count_commits(q: Quick) -> Any:
    """From now on, the commits of ``q``'s store's transactions: a function that says how
    many so far."""
    count = [0]
    real = q.kv.create_transaction

    def counting() -> Any:
        tr = real()
        commit = tr.commit

        def counted(*a: Any, **k: Any) -> Any:
            count[0] += 1
            return commit(*a, **k)

        tr.commit = counted
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return lambda: count[0]


def test_the_gate_backs_off_while_conflicts_go_on_and_recovers(clock: ManualClock) -> None:
    gate = OneTransactionGate(True, clock, first_hold_s=0.01, max_hold_s=0.04)
    z, other = ("c", 0, "z"), ("c", 0, "other")
    assert gate.try_one(z)
    gate.conflicted(z)  # three transactions for the next 10 ms, however many visits
    assert not any(gate.try_one(z) for _ in range(50))
    assert gate.try_one(other)  # another zone keeps its one transaction
    clock.advance(0.01)
    assert gate.try_one(z)
    gate.conflicted(z)  # again: 20 ms
    clock.advance(0.019)
    assert not gate.try_one(z)
    clock.advance(0.001)
    assert gate.try_one(z)
    for _ in range(3):
        gate.conflicted(z)
        clock.advance(0.04)
    gate.conflicted(z)  # capped at 40 ms
    clock.advance(0.039)
    assert not gate.try_one(z)
    clock.advance(0.001)
    assert gate.try_one(z)
    gate.committed(z)
    gate.committed(z)
    gate.conflicted(z)  # halved twice: 10 ms
    clock.advance(0.01)
    assert gate.try_one(z)
    gate.conflicted(z)  # 20 ms
    clock.step_back(3600)  # the wall clock set back an hour: the hold is still 20 ms
    clock.advance(0.02)
    assert gate.try_one(z)
    assert not OneTransactionGate(False, clock).try_one(z)


def test_the_gate_forgets_zones_whose_hold_ran_out(clock: ManualClock) -> None:
    """A consumer of a million tenants keeps no state for the zones that conflicted
    once, long ago: a zone back at its first hold is forgotten when it commits, and past
    MAX_HELD_ZONES the zones whose hold ran out are dropped."""
    from quickzones.consumer import visit_gate

    gate = OneTransactionGate(True, clock, first_hold_s=0.01)
    gate.conflicted(("c", 0, "z"))
    clock.advance(0.01)
    gate.committed(("c", 0, "z"))
    assert gate._held == {}
    for n in range(visit_gate.MAX_HELD_ZONES + 1):
        gate.conflicted(("c", 0, str(n)))
    clock.advance(0.01)
    gate.conflicted(("c", 0, "last"))
    assert list(gate._held) == [("c", 0, "last")]
    # Which zones conflicted lately (visited alone): the most recent MAX_HELD_ZONES.
    assert len(gate._conflicted_at) == visit_gate.MAX_HELD_ZONES
    assert gate.alone(("c", 0, "last")) and not gate.alone(("c", 0, "1"))
    clock.advance(visit_gate.ALONE_S)
    assert not gate.alone(("c", 0, "last"))

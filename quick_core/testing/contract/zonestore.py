"""The zone store contract: what every :class:`~quickzones.store.zonestore.ZoneStore` must do
(paper section 5; docs/design.md "Zone operations"), shipped so an out-of-tree store runs the
same checks as the KV zones and Cassandra zones.

Each ``test_*`` function takes one fixture, ``zone_store_env``: a :class:`ZoneStoreEnv`
with a fresh store, the KV store its pointers live in, and the
:class:`~quickzones.clock.ManualClock` the store reads. To run the contract on a store,
star-import this module into a test module and provide that fixture::

    from quickzones.testing.contract.zonestore import *  # noqa: F403 - the contract's tests
    from quickzones.testing.contract.zonestore import ZoneStoreEnv

    @pytest.fixture
    def zone_store_env(tmp_path):
        clock = ManualClock()
        kv = ...                      # the pointers' KV store
        q = Quick(kv, clock=clock, zone_store=lambda q: MyZoneStore(q.kv, q.toplevel))
        yield ZoneStoreEnv(q.items, q.kv, clock)
        q.close()

Nothing here knows which store it runs on. Imports pytest: only tests import this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from quickzones.clock import ManualClock, ms_up, now_ms
from quickzones.errors import ItemNotFound, ItemNotVested, LeaseLost
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zonestore import NewItem, ZoneStore

Z = ZoneId("contract", "tenant-1")
OTHER = ZoneId("contract", "tenant-2")
LEASE_MS = 10_000


@dataclass(frozen=True)
class ZoneStoreEnv:
    """A store under test, the KV store of its pointers, and the clock it reads."""

    store: ZoneStore
    kv: KVStore
    clock: ManualClock


def add(
    env: ZoneStoreEnv,
    payload: bytes = b"",
    *,
    zone: ZoneId = Z,
    delay_ms: int = 0,
    priority: int = 0,
    item_id: str | None = None,
) -> str:
    item = NewItem("job", payload, delay_ms=delay_ms, priority=priority, item_id=item_id)
    return env.store.enqueue(zone, item)


def ids(items: list[WorkItem]) -> list[str]:
    return [i.item_id for i in items]


def now(env: ZoneStoreEnv) -> int:
    return now_ms(env.clock)


def holder_calls(env: ZoneStoreEnv, item_id: str) -> list[Callable[[str], object]]:
    """What only the lease holder may do to ``item_id``, each a function of a lease id."""
    return [
        lambda lease: env.store.complete(Z, item_id, lease),
        lambda lease: env.store.extend_lease(Z, item_id, lease, LEASE_MS),
        lambda lease: env.store.requeue(Z, item_id, lease, 0),
    ]


def in_kv(env: ZoneStoreEnv, fn: object) -> object:
    """Run ``fn(tr)`` in a KV transaction whose read version is fixed first, as the
    pointer-deleting transaction runs the zone store's strong reads."""
    assert callable(fn)

    def body(tr: KVTransaction) -> object:
        tr.get_read_version()
        return fn(tr)

    return run(env.kv, body)


# --- enqueue, get, count ------------------------------------------------------------------


def test_enqueue_get_and_count(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env, b"a")
    b = add(env, b"b")
    assert a != b
    item = env.store.get(Z, a)
    assert item is not None and item.payload == b"a" and item.job_type == "job"
    assert item.lease_id is None and item.error_count == 0
    assert env.store.get(Z, "no-such-id") is None
    assert env.store.count(Z) == 2 and env.store.count(OTHER) == 0
    assert env.store.counts([OTHER, Z, OTHER]) == [0, 2, 0]
    assert env.store.counts([]) == []


def test_a_delayed_item_never_vests_before_its_time(zone_store_env: ZoneStoreEnv) -> None:
    """Stored times are whole milliseconds: a delayed item's vesting time is rounded up, so
    a clock reading between two milliseconds cannot make it vest before now + delay."""
    env = zone_store_env
    # 0.4 ms into a millisecond, wherever the clock starts (a store on real time starts
    # at time.time(): a reading within a microsecond past a millisecond is what ms_up's
    # float tolerance rounds down, which is not this test's case).
    start_ms = env.clock.now() * 1000
    env.clock.advance((math.ceil(start_ms) - start_ms) / 1000 + 0.0004)
    asked_at = env.clock.now() * 1000
    a = add(env, delay_ms=10)
    item = env.store.get(Z, a)
    assert item is not None
    assert asked_at + 10 <= item.vesting_ms < asked_at + 10 + 1
    b = add(env)  # no delay: vested now, as before
    undelayed = env.store.get(Z, b)
    assert undelayed is not None and undelayed.vesting_ms == now(env)


def test_caller_chosen_id_is_idempotent(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    assert add(env, b"first", item_id="fixed") == "fixed"
    assert add(env, b"first", item_id="fixed") == "fixed"  # the same job: a no-op
    with pytest.raises(DuplicateItemMismatch):  # another job is refused, never dropped
        add(env, b"second", item_id="fixed")
    assert env.store.count(Z) == 1
    item = env.store.get(Z, "fixed")
    assert item is not None and item.payload == b"first"


# --- peek ---------------------------------------------------------------------------------


def test_peek_orders_by_priority_then_vesting(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    late = add(env, priority=0, delay_ms=2_000)
    low = add(env, priority=5)
    early = add(env, priority=0, delay_ms=1_000)
    urgent = add(env, priority=-3, delay_ms=3_000)
    env.clock.advance(4)
    assert ids(env.store.peek(Z, 10)) == [urgent, early, late, low]
    assert ids(env.store.peek(Z, 2)) == [urgent, early]


def test_peek_returns_only_vested_items_of_its_zone(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    vested = add(env)
    add(env, delay_ms=60_000)
    add(env, zone=OTHER)
    assert ids(env.store.peek(Z, 10)) == [vested]


def test_peek_takes_no_lease(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    [peeked] = env.store.peek(Z, 1)
    assert peeked.lease_id is None
    assert ids(env.store.peek(Z, 1)) == [a]
    assert env.store.obtain_lease(Z, a, LEASE_MS).lease_id is not None


# --- leases -------------------------------------------------------------------------------


def test_obtain_lease_hides_the_item_until_it_expires(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    assert leased.vesting_ms == now(env) + LEASE_MS
    assert env.store.peek(Z, 10) == []
    with pytest.raises(ItemNotVested):
        env.store.obtain_lease(Z, a, LEASE_MS)
    env.clock.advance(LEASE_MS / 1000 + 1)
    assert ids(env.store.peek(Z, 10)) == [a]  # visible again (invariant 5)
    again = env.store.obtain_lease(Z, a, LEASE_MS)
    assert again.lease_id not in (None, leased.lease_id)


def test_obtain_lease_of_a_missing_item(zone_store_env: ZoneStoreEnv) -> None:
    with pytest.raises(ItemNotFound):
        zone_store_env.store.obtain_lease(Z, "no-such-id", LEASE_MS)


def test_not_yet_vested_item_cannot_be_leased(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    later = add(env, delay_ms=60_000)
    with pytest.raises(ItemNotVested):
        env.store.obtain_lease(Z, later, LEASE_MS)


def test_complete_only_by_the_holder(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    with pytest.raises(LeaseLost):
        env.store.complete(Z, a, "not-the-lease")
    env.store.complete(Z, a, leased.lease_id)
    assert env.store.get(Z, a) is None and env.store.count(Z) == 0
    with pytest.raises(ItemNotFound):
        env.store.complete(Z, a, leased.lease_id)


def test_complete_without_lease_id_cancels(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    env.store.obtain_lease(Z, a, LEASE_MS)
    env.store.complete(Z, a, None)
    assert env.store.get(Z, a) is None
    with pytest.raises(ItemNotFound):
        env.store.complete(Z, a, None)


def test_lease_lost_is_told_from_item_gone(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    first = env.store.obtain_lease(Z, a, LEASE_MS)
    assert first.lease_id is not None
    env.clock.advance(LEASE_MS / 1000 + 1)
    second = env.store.obtain_lease(Z, a, LEASE_MS)  # the first lease lapsed
    assert second.lease_id is not None
    for call in holder_calls(env, a):
        with pytest.raises(LeaseLost):
            call(first.lease_id)
    env.store.complete(Z, a, second.lease_id)
    for call in holder_calls(env, a):
        with pytest.raises(ItemNotFound):
            call(second.lease_id)


def test_extend_lease_by_the_holder(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    env.clock.advance(5)
    extended = env.store.extend_lease(Z, a, leased.lease_id, LEASE_MS)
    assert extended.lease_id == leased.lease_id
    assert extended.vesting_ms == now(env) + LEASE_MS
    env.clock.advance(LEASE_MS / 1000 - 1)  # past the first lease's end, not the new one
    assert env.store.peek(Z, 10) == []


def test_extend_after_expiry_holds_while_nobody_leased(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    env.clock.advance(LEASE_MS / 1000 + 1)
    extended = env.store.extend_lease(Z, a, leased.lease_id, LEASE_MS)
    assert extended.vesting_ms == now(env) + LEASE_MS
    env.store.complete(Z, a, leased.lease_id)


def test_requeue_releases_and_delays(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    back = env.store.requeue(Z, a, leased.lease_id, 2_000, error="boom", meta={"k": "v"})
    assert back.lease_id is None and back.error_count == 1 and back.last_error == "boom"
    assert back.vesting_ms == ms_up(env.clock.now() + 2)  # rounded up, never early
    stored = env.store.get(Z, a)
    assert stored is not None and stored.error_count == 1 and stored.meta.get("k") == "v"
    with pytest.raises(LeaseLost):  # the released lease completes nothing
        env.store.complete(Z, a, leased.lease_id)
    assert env.store.peek(Z, 10) == []
    env.clock.advance(2.001)
    assert ids(env.store.peek(Z, 10)) == [a]
    again = env.store.obtain_lease(Z, a, LEASE_MS)
    assert again.lease_id is not None
    nacked = env.store.requeue(Z, a, again.lease_id, 0, count_error=False)
    assert nacked.error_count == 1


def test_a_requeue_delay_never_ends_early(zone_store_env: ZoneStoreEnv) -> None:
    """A requeue's delay (a retry's backoff, a nack's) is rounded up to the millisecond,
    as a delayed enqueue's: the item never vests before the clock's reading plus the
    delay, nor a millisecond or more after it."""
    env = zone_store_env
    a = add(env)
    env.clock.advance(0.0004)  # into a millisecond, wherever the clock started
    for delay_ms in (1, 2_000):
        leased = env.store.obtain_lease(Z, a, LEASE_MS)
        assert leased.lease_id is not None
        asked = env.clock.now() * 1000 + delay_ms
        back = env.store.requeue(Z, a, leased.lease_id, delay_ms)
        assert asked - 0.001 <= back.vesting_ms < asked + 1, (delay_ms, asked, back.vesting_ms)
        env.clock.advance(delay_ms / 1000 + 0.001)  # vested again, 0.4 ms into a ms


def test_requeue_not_before_a_given_time(zone_store_env: ZoneStoreEnv) -> None:
    """``not_before_ms`` (a consumer giving back an item it leased ahead of its vesting
    time) wins over a shorter delay, never over a longer one."""
    env = zone_store_env
    a = add(env)
    leased = env.store.obtain_lease(Z, a, LEASE_MS)
    assert leased.lease_id is not None
    back = env.store.requeue(
        Z, a, leased.lease_id, 0, count_error=False, not_before_ms=now(env) + 1_500
    )
    assert back.vesting_ms == now(env) + 1_500 and back.error_count == 0
    env.clock.advance(1.5)
    again = env.store.obtain_lease(Z, a, LEASE_MS)
    assert again.lease_id is not None
    later = env.store.requeue(Z, a, again.lease_id, 3_000, not_before_ms=now(env) + 1)
    assert later.vesting_ms == ms_up(env.clock.now() + 3)


# --- dequeue ------------------------------------------------------------------------------


def test_dequeue_is_bounded_and_leases_in_peek_order(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    made = [add(env, priority=p) for p in (3, 1, 2, 0, 4)]
    taken, corrupt = env.store.dequeue(Z, 3, LEASE_MS)
    assert corrupt == []
    assert ids(taken) == [made[3], made[1], made[2]]
    assert all(i.lease_id is not None for i in taken)
    assert ids(env.store.peek(Z, 10)) == [made[0], made[4]]
    rest, _ = env.store.dequeue(Z, 10, LEASE_MS)
    assert ids(rest) == [made[0], made[4]]
    assert env.store.dequeue(Z, 10, LEASE_MS) == ([], [])
    for item in taken + rest:
        assert item.lease_id is not None
        env.store.complete(Z, item.item_id, item.lease_id)
    assert env.store.count(Z) == 0


def test_dequeue_leaves_refused_and_unvested_items(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    keep = add(env, b"keep")
    take = add(env, b"take")
    add(env, b"later", delay_ms=60_000)
    taken, _ = env.store.dequeue(Z, 10, LEASE_MS, accept=lambda i: i.payload == b"take")
    assert ids(taken) == [take]
    assert ids(env.store.peek(Z, 10)) == [keep]


def test_an_enqueue_committed_during_a_dequeue_does_not_run_it_again(
    zone_store_env: ZoneStoreEnv,
) -> None:
    """A busy tenant's producer enqueues while a consumer dequeues its zone in the
    dequeue's own transaction (the paper's three-transaction visit). What the dequeue
    leases is unchanged by the new item, and the requeue that follows reads the zone in
    a transaction of its own: the dequeue commits as it is, it is not run again (after
    the store's conflict backoff, for as long as the enqueues go on: a small tenant
    batched with the busy one waited 12 ms behind it in ``quick demo``)."""
    env = zone_store_env
    first = add(env, b"a")
    seen: list[str] = []

    def accept(item: WorkItem) -> bool:
        seen.append(item.item_id)
        if len(seen) == 1:
            add(env, b"b")  # committed between the dequeue's reads and its commit
        return True

    taken, _ = env.store.dequeue(Z, 10, LEASE_MS, accept=accept)
    assert ids(taken) == [first]
    assert seen == [first], "the dequeue ran again"
    later, _ = env.store.dequeue(Z, 10, LEASE_MS)
    assert [i.payload for i in later] == [b"b"]  # there for the next visit


def test_complete_many_reports_each_outcome(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    add(env)
    add(env)
    taken, _ = env.store.dequeue(Z, 2, LEASE_MS)
    leased = [(i.item_id, i.lease_id or "") for i in taken]
    outcomes = env.store.complete_many(Z, [*leased, (leased[0][0], "stale")])
    assert outcomes[:2] == [None, None]
    assert isinstance(outcomes[2], (ItemNotFound, LeaseLost))
    assert env.store.count(Z) == 0


# --- held leases: a run counted when it starts, never for a crash before (issue 40) ------


def _attempts(env: ZoneStoreEnv, item_id: str) -> int:
    item = env.store.get(Z, item_id)
    assert item is not None
    return item.attempts


def test_dequeue_counts_the_runs_that_start_now_and_holds_the_rest(
    zone_store_env: ZoneStoreEnv,
) -> None:
    env = zone_store_env
    made = [add(env, priority=p) for p in range(3)]  # taken in this order
    taken, _ = env.store.dequeue(Z, 3, LEASE_MS, start_now=1)
    assert ids(taken) == made
    assert [(i.held, i.attempts) for i in taken] == [(False, 1), (True, 0), (True, 0)]
    assert [_attempts(env, x) for x in made] == [1, 0, 0]
    assert all(i.lease_id is not None for i in taken)
    assert env.store.peek(Z, 10) == []  # held items are leased like any other


def test_a_held_lease_counts_its_run_at_its_start_check(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    [held], _ = env.store.dequeue(Z, 1, LEASE_MS, start_now=0)
    assert held.lease_id is not None
    started = env.store.start(Z, a, held.lease_id)
    assert (started.held, started.attempts) == (False, 1)
    assert _attempts(env, a) == 1
    again = env.store.start(Z, a, held.lease_id)  # started already: counted once
    assert (again.held, again.attempts) == (False, 1)
    env.store.complete(Z, a, held.lease_id)
    assert env.store.count(Z) == 0


def test_a_held_lease_that_lapses_counts_nothing(zone_store_env: ZoneStoreEnv) -> None:
    """Its consumer crashed before it started: the next lease is the first run."""
    env = zone_store_env
    a = add(env)
    for _crash in range(3):
        [held], _ = env.store.dequeue(Z, 1, LEASE_MS, start_now=0)
        assert held.attempts == 0
        env.clock.advance(LEASE_MS / 1000 + 1)
    [run], _ = env.store.dequeue(Z, 1, LEASE_MS)
    assert (run.held, run.attempts) == (False, 1)
    assert _attempts(env, a) == 1


def test_a_started_run_that_lapsed_is_replaced_once_held_or_not(
    zone_store_env: ZoneStoreEnv,
) -> None:
    """A run whose lease lapsed (its consumer crashed while it ran) has its count taken
    over by the next run, whether that run's lease starts at once or waits first."""
    env = zone_store_env
    a = add(env)
    [first], _ = env.store.dequeue(Z, 1, LEASE_MS)
    assert first.attempts == 1
    env.clock.advance(LEASE_MS / 1000 + 1)
    [held], _ = env.store.dequeue(Z, 1, LEASE_MS, start_now=0)
    assert held.lease_id is not None
    assert env.store.start(Z, a, held.lease_id).attempts == 1
    env.clock.advance(LEASE_MS / 1000 + 1)
    [direct], _ = env.store.dequeue(Z, 1, LEASE_MS)
    assert direct.attempts == 1


def test_a_held_lease_given_back_counts_nothing(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    a = add(env)
    [held], _ = env.store.dequeue(Z, 1, LEASE_MS, start_now=0)
    assert held.lease_id is not None
    back = env.store.requeue(Z, a, held.lease_id, 0, count_error=False, ran=False)
    assert (back.held, back.attempts, back.lease_id) == (False, 0, None)
    [run], _ = env.store.dequeue(Z, 1, LEASE_MS)
    assert (run.held, run.attempts) == (False, 1)


# --- minimum vesting and emptiness --------------------------------------------------------


def test_min_vesting_follows_items_and_leases(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    assert env.store.min_vesting_ms(Z) is None
    # Delayed items vest at now + delay rounded up (a clock between two ms rounds up).
    start = ms_up(env.clock.now())
    later = add(env, delay_ms=5_000)
    assert env.store.min_vesting_ms(Z) == start + 5_000
    first = add(env, delay_ms=1_000)
    assert env.store.min_vesting_ms(Z) == start + 1_000
    assert in_kv(env, lambda tr: env.store.min_vesting_ms(Z, tr=tr)) == start + 1_000
    env.clock.advance(2)
    leased = env.store.obtain_lease(Z, first, LEASE_MS)  # now vests at its lease end
    assert env.store.min_vesting_ms(Z) == start + 5_000
    assert leased.lease_id is not None
    env.store.complete(Z, first, leased.lease_id)
    env.store.complete(Z, later, None)
    assert env.store.min_vesting_ms(Z) is None


def test_emptiness_check(zone_store_env: ZoneStoreEnv) -> None:
    env = zone_store_env
    assert in_kv(env, lambda tr: env.store.zone_is_empty(tr, Z)) is True
    a = add(env)
    add(env, zone=OTHER)
    assert in_kv(env, lambda tr: env.store.zone_is_empty(tr, Z)) is False
    leased = env.store.obtain_lease(Z, a, LEASE_MS)  # a leased item still counts
    assert in_kv(env, lambda tr: env.store.zone_is_empty(tr, Z)) is False
    assert leased.lease_id is not None
    env.store.complete(Z, a, leased.lease_id)
    assert in_kv(env, lambda tr: env.store.zone_is_empty(tr, Z)) is True
    assert in_kv(env, lambda tr: env.store.zone_is_empty(tr, OTHER)) is False


# What a star import brings into a test module: the contract's tests.
__all__ = sorted(name for name in dict(globals()) if name.startswith("test_"))

"""Exact timers by lookahead (issue 15 point 5): a running consumer leases items that vest
within ``timer_lookahead_s`` ahead and starts each on its own timer at its vesting time,
so the visit's commits are not in the item's lateness. Nothing may start early, an item
someone else holds is never taken before that lease ends, and a stop gives held items
back due at the same time as before. Lateness itself is measured by
bench/delayed_lateness.py, not asserted."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, cast

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import Consumer, ConsumerConfig
from quickzones.errors import ConfigurationError, ZoneLeaseFailed
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.zonestore import VisitTransactions
from tests.waiting import wait_for

Z = ZoneId("app", "t1")
LEASE_MS = 30_000


def ahead(q: Quick) -> VisitTransactions:
    assert q.zones.capabilities.lookahead_dequeue
    return cast(VisitTransactions, q.zones)


# --- the store: dequeue and pointer lease with a horizon (manual clock, every backend) ---


def test_a_dequeue_with_a_horizon_takes_items_vesting_within_it_and_no_later(
    q: Quick, clock: ManualClock
) -> None:
    now = now_ms(clock)
    soon = q.enqueue("j", b"", app="app", tenant="t1", delay=0.03)
    q.enqueue("j", b"", app="app", tenant="t1", delay=0.2)
    vested = q.enqueue("j", b"", app="app", tenant="t1")

    items, _ = ahead(q).dequeue(Z, 10, LEASE_MS, horizon_ms=50)

    assert [i.item_id for i in items] == [vested, soon]
    # The vested one's lease runs from now, the early one's from its vesting time.
    assert items[0].vesting_ms == now + LEASE_MS
    assert items[1].vesting_ms == now + 30 + LEASE_MS
    assert q.zones.dequeue(Z, 10, LEASE_MS) == ([], [])  # the 200 ms one is not vested


def test_vested_items_come_before_ones_taken_ahead(q: Quick, clock: ManualClock) -> None:
    soon = q.enqueue("j", b"", app="app", tenant="t1", delay=0.01)
    fifo = q.enqueue("j", b"", app="app", tenant="t1", fifo=True)  # sorts after keyed ones
    first, _ = ahead(q).dequeue(Z, 1, LEASE_MS, horizon_ms=50)
    second, _ = ahead(q).dequeue(Z, 1, LEASE_MS, horizon_ms=50)
    assert [i.item_id for i in first + second] == [fifo, soon]


class _RangeReads:
    """A transaction that counts its range reads."""

    def __init__(self, tr: KVTransaction) -> None:
        self._tr = tr
        self.range_reads = 0

    def get_range(self, *args: Any, **kwargs: Any) -> list[tuple[bytes, bytes]]:
        self.range_reads += 1
        return self._tr.get_range(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tr, name)


def _dequeue_counting(q: Quick, zone: ZoneId, horizon_ms: int) -> tuple[list[str], int]:
    tr = _RangeReads(q.kv.create_transaction())
    items, _ = ahead(q).dequeue(
        zone, 10, LEASE_MS, horizon_ms=horizon_ms, tr=cast(KVTransaction, tr)
    )
    tr.commit()
    return [i.item_id for i in items], tr.range_reads


def test_a_lookahead_dequeue_with_room_left_reads_the_zone_once(
    q: Quick, clock: ManualClock
) -> None:
    """A zone holding fewer items than the visit may take (most zones, most visits): the
    look ahead costs no second pass over its order index."""
    taken = {}
    for tenant in ("plain", "ahead"):
        soon = q.enqueue("j", b"", app="app", tenant=tenant, delay=0.03)
        q.enqueue("j", b"", app="app", tenant=tenant, delay=0.5)
        vested = q.enqueue("j", b"", app="app", tenant=tenant)
        taken[tenant] = [vested, soon]
    plain, plain_reads = _dequeue_counting(q, ZoneId("app", "plain"), 0)
    looked, ahead_reads = _dequeue_counting(q, ZoneId("app", "ahead"), 50)
    assert plain == taken["plain"][:1] and looked == taken["ahead"]
    assert ahead_reads == plain_reads


def test_an_item_someone_holds_is_not_taken_before_that_lease_ends(
    q: Quick, clock: ManualClock
) -> None:
    item_id = q.enqueue("j", b"", app="app", tenant="t1")
    [held], _ = q.zones.dequeue(Z, 1, 40)  # a 40 ms lease: it ends within the horizon
    assert ahead(q).dequeue(Z, 10, LEASE_MS, horizon_ms=50) == ([], [])
    # The holder still holds it: completing with its lease works.
    q.zones.complete(Z, item_id, held.lease_id)


def test_pointers_vesting_within_the_horizon_are_peeked_and_leased(
    q: Quick, clock: ManualClock
) -> None:
    q.enqueue("j", b"", app="app", tenant="t1", delay=0.03)
    due = now_ms(clock) + 30
    assert q.toplevel.peek(0, 10) == ([], due)
    refs, later = q.toplevel.peek(0, 10, horizon_ms=50)
    assert [r.vesting_ms for r in refs] == [due] and later is None
    with pytest.raises(ZoneLeaseFailed):
        q.toplevel.obtain_pointer_lease(refs[0], 1000)  # not vested, no horizon
    leased = q.toplevel.obtain_pointer_lease(refs[0], 1000, horizon_ms=50)
    assert leased.zone == Z


def test_a_pointer_another_consumer_leased_is_not_leased_ahead(
    q: Quick, clock: ManualClock
) -> None:
    q.enqueue("j", b"", app="app", tenant="t1")
    [ref] = q.toplevel.peek(0, 10)[0]
    q.toplevel.obtain_pointer_lease(ref, 40)  # ends within the horizon
    [again] = q.toplevel.peek(0, 10, horizon_ms=50)[0]
    with pytest.raises(ZoneLeaseFailed):
        q.toplevel.obtain_pointer_lease(again, 1000, horizon_ms=50)


def test_a_negative_horizon_is_refused(q: Quick) -> None:
    with pytest.raises(ValueError, match="horizon_ms"):
        ahead(q).dequeue(Z, 1, LEASE_MS, horizon_ms=-1)


def test_single_threaded_driving_never_looks_ahead(q: Quick, clock: ManualClock) -> None:
    ran: list[str] = []
    q.job("j")(lambda payload, ctx: ran.append(ctx.item_id))
    q.enqueue("j", b"", app="app", tenant="t1", delay=0.01)
    consumer = q.consumer(ConsumerConfig(timer_lookahead_s=1.0))
    assert consumer.run_until_idle() == 0 and ran == []
    clock.advance(0.01)
    assert consumer.run_until_idle() == 1


@pytest.mark.parametrize("bad", [-0.1, 16.0])
def test_a_lookahead_outside_half_the_item_lease_is_refused(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="timer_lookahead_s"):
        ConsumerConfig(timer_lookahead_s=bad, item_lease_s=30).validate()


# --- a running consumer (system clock, real threads) ---------------------------------


def test_items_leased_ahead_start_at_their_vesting_time_and_not_before(real_q: Quick) -> None:
    started: dict[str, float] = {}
    real_q.job("timed")(lambda payload, ctx: started.setdefault(ctx.item_id, real_q.clock.now()))
    dequeued: dict[str, int] = {}

    def observe(event: str, fields: dict[str, Any]) -> None:
        if event == "dequeued":
            dequeued[fields["item_id"]] = fields["pickup_ms"]

    # A long lookahead: each item is leased at once, well before it vests, even on a
    # loaded machine.
    # Four held on timers at once by two workers: a prefetch (processing_bound).
    consumer = real_q.consumer(ConsumerConfig(timer_lookahead_s=1.5, workers=2, processing_bound=4))
    consumer.observer = observe
    due: dict[str, int] = {}
    for ms in (700, 900, 1200, 1200):
        item_id = real_q.enqueue("timed", b"", app="a", tenant=f"t{ms}", delay=ms / 1000)
        # Read before the consumer runs: a lease taken ahead moves the vesting time.
        due[item_id] = real_q.zones.get(ZoneId("a", f"t{ms}"), item_id).vesting_ms  # type: ignore[union-attr]
    consumer.start()
    try:
        assert wait_for(lambda: len(started) == 4)
    finally:
        consumer.stop(5)
    for item_id, vesting in due.items():
        assert started[item_id] * 1000 >= vesting, "started before its vesting time"
        assert dequeued[item_id] < vesting, "not leased ahead: the lookahead did nothing"


def test_a_stop_gives_back_held_items_due_at_the_same_time(real_q: Quick) -> None:
    started: list[float] = []
    real_q.job("timed")(lambda payload, ctx: started.append(time.time()))
    leased = threading.Event()
    consumer = real_q.consumer(ConsumerConfig(timer_lookahead_s=5.0))
    consumer.observer = lambda event, fields: leased.set() if event == "dequeued" else None
    # Its vesting time read before the consumer starts: once leased ahead, the stored
    # vesting is the lease's end (the clean-clone CI run at 4125acb read it after the
    # consumer's lease, 30 s late).
    item_id = real_q.enqueue("timed", b"", app="a", tenant="t", delay=3.0)
    vesting = real_q.zones.get(ZoneId("a", "t"), item_id).vesting_ms  # type: ignore[union-attr]
    consumer.start()
    try:
        assert leased.wait(20)
        status = real_q.status("a", "t", item_id)
        assert status is not None and status.state == "leased"
    finally:
        consumer.stop(5)
    assert started == []
    status = real_q.status("a", "t", item_id)
    assert status is not None and status.state == "queued", status
    # Back at its own vesting time, not vested at the stop, and no error counted.
    assert status.next_vesting_ms == vesting and status.error_count == 0
    # Another consumer starts it then, not before.
    other = real_q.consumer(ConsumerConfig(timer_lookahead_s=0))
    other.start()
    try:
        assert wait_for(lambda: bool(started))
    finally:
        other.stop(5)
    assert started[0] * 1000 >= vesting


class _NoLookahead:
    """A zone store like Cassandra's: no ``lookahead_dequeue``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.capabilities = replace(inner.capabilities, lookahead_dequeue=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_store_without_the_capability_is_not_looked_ahead(real_q: Quick) -> None:
    assert ConsumerConfig().timer_lookahead_s > 0  # on by default
    config = ConsumerConfig(timer_lookahead_s=0.2)
    assert real_q.consumer(config).scanner.lookahead_ms == 200
    plain = Consumer(_NoLookahead(real_q.zones), real_q.toplevel, real_q.registry, config=config)
    assert plain.scanner.lookahead_ms == 0

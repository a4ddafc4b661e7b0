"""Zones holding the fewest of a consumer's items are visited first (water-filling
admission).

The complaint it answers: while one tenant's backlog drains, its items fill the
consumer's ``processing_bound``; when a slot frees, the scan selects the backlog's pointer
(the oldest, so first in order mode) and a new tenant's pointer, and the visit gives the
free slot to whichever comes first. The backlog won again and again, and a small tenant's
single item waited for slot after slot. A scan now orders what it selected by how many of
this consumer's items each zone holds, fewest first; zones holding none keep the scan's own
order (oldest first in order mode, so no pointer starves: invariant 10).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig

ONE_SLOT_FREE = dict(in_order=True, dequeue_max=4, processing_bound=8)


def _fill_with_backlog(q: Quick, clock: ManualClock, config: ConsumerConfig) -> Any:
    """A consumer holding ``processing_bound`` items of tenant "big" (of 40), then a new
    tenant "small" with one item, enqueued later (so its pointer is the younger)."""
    q.job("j")(lambda payload, ctx: None)
    q.enqueue_many("j", list(range(40)), app="app", tenant="big")
    consumer = q.consumer(config)
    held = []
    while consumer.capacity() > 0:
        held += consumer.visit_many(consumer.scan_once())
    assert {w.zone.tenant for w in held} == {"big"} and len(held) == 8
    clock.advance(1.0)
    q.enqueue("j", "hello", app="app", tenant="small")
    return consumer, held


def test_a_freed_slot_goes_to_the_tenant_holding_none_in_a_batch(
    q: Quick, clock: ManualClock
) -> None:
    config = ConsumerConfig(**ONE_SLOT_FREE, one_transaction_visits=True, visits_per_transaction=8)
    consumer, held = _fill_with_backlog(q, clock, config)
    consumer.execute(held[0])  # one slot frees
    refs = consumer.scan_once()
    # Both tenants' pointers are vested; one slot is free: the zone holding fewest only.
    assert len(refs) == 1 and consumer.scanner.left_vested

    works = consumer.visit_many(refs)

    assert [w.zone.tenant for w in works] == ["small"]


def test_a_freed_slot_goes_to_the_tenant_holding_none_in_single_visits(
    q: Quick, clock: ManualClock
) -> None:
    consumer, held = _fill_with_backlog(q, clock, ConsumerConfig(**ONE_SLOT_FREE))
    consumer.execute(held[0])

    first = consumer.scan_once()[0]

    assert [w.zone.tenant for w in consumer.visit(first)] == ["small"]


def test_with_nothing_held_the_oldest_pointer_still_comes_first(
    q: Quick, clock: ManualClock
) -> None:
    """Invariant 10: once the backlog's items are finished it holds none, and its older
    pointer is first again; the count of held items does not outlive them."""
    consumer, held = _fill_with_backlog(q, clock, ConsumerConfig(**ONE_SLOT_FREE))
    for work in held:
        consumer.execute(work)
    assert consumer.in_flight() == 0

    assert [w.zone.tenant for w in consumer.visit(consumer.scan_once()[0])] == ["big"] * 4


def test_a_running_consumer_starts_a_new_tenant_before_the_backlog_drains(
    real_q: Quick,
) -> None:
    """Threaded, on the system clock: a backlog of 60 slow items (one consumer, 2 workers,
    room for 4, visits that could take every freed slot) and then one item of a new
    tenant: it starts within a few of the backlog's slots, not after the backlog. (Here it
    starts at the next free slot, where it started 2-4 slots later without the ordering:
    the backlog's pointer, requeued at its visit, became the younger after one more visit.
    The bound is loose because the threads' timing is the host's.)"""
    q = real_q
    order: list[str] = []
    lock = threading.Lock()

    def handler(payload: Any, ctx: Any) -> None:
        with lock:
            order.append(ctx.tenant)
        if ctx.tenant == "big":
            time.sleep(0.02)

    q.job("j")(handler)
    q.enqueue_many("j", list(range(60)), app="app", tenant="big")
    config = ConsumerConfig(
        in_order=True,
        dequeue_max=4,  # the backlog could take every freed slot
        processing_bound=4,
        workers=2,
        managers=1,
        idle_sleep_s=0.005,
        one_transaction_visits=True,
        visits_per_transaction=8,
    )
    consumer = q.consumer(config)
    consumer.start()
    try:
        deadline = time.monotonic() + 10
        while len(order) < 6 and time.monotonic() < deadline:
            time.sleep(0.005)
        q.enqueue("j", "hello", app="app", tenant="small")
        while "small" not in order and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        consumer.stop()
    assert "small" in order
    started_after = order.index("small") - 6
    # The enqueue lands among items already held (at most processing_bound of them);
    # the next freed slot is the new tenant's.
    assert started_after <= 6, order

"""A delayed item never starts before the time its enqueue asked for, by the caller's
clock: ``enqueue(..., delay=d)`` called at ``t`` starts at ``t + d`` or later.

Stored times are whole milliseconds. Rounding the enqueue time and the delay down let an
item vest up to about 1 ms before ``t + d``, and a consumer that starts items on its own
timer (the timer lookahead) started most of them that early: in the peer benchmark's
delayed workload 233 of 300 items started 0.1-1 ms before their due time.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, vesting_after
from quickzones.consumer import ConsumerConfig
from quickzones.store.records import ZoneId
from tests.waiting import wait_for


@pytest.mark.parametrize("delay", [0.0101, 0.5, 1.1, 2.0004, 3.9999])
def test_a_delay_is_rounded_up_to_the_millisecond(
    q: Quick, clock: ManualClock, delay: float
) -> None:
    clock.advance(0.0004)  # 0.4 ms into a millisecond
    asked = (clock.now() + delay) * 1000
    item_id = q.enqueue("j", b"", app="a", tenant="t", delay=delay)
    item = q.items.get(ZoneId("a", "t"), item_id)
    assert item is not None
    # Never before; later by less than 1 ms (now + delay rounded up once).
    assert asked - 0.001 <= item.vesting_ms < asked + 1


def test_every_zone_stores_delay_is_rounded_up_in_one_place() -> None:
    """``vesting_after``, which the KV zones and the Cassandra zones both call for a delayed
    enqueue and a requeue (retry, nack): now plus the delay rounded up; now without one.
    Before it, the Cassandra zones truncated a requeue's delay: an item nacked for 1 ms
    at 0.87 ms into a millisecond vested 0.87 ms early (the zone store contract's
    test_a_requeue_delay_never_ends_early[cassandra])."""
    clock = ManualClock(1_000.0004)
    assert vesting_after(clock, 0) == 1_000_000
    assert vesting_after(clock, 1) == 1_000_002
    assert vesting_after(clock, 2_000) == 1_002_001
    assert vesting_after(ManualClock(1_000.0), 1_100) == 1_001_100  # a float error is not a ms


def test_enqueue_many_rounds_up_too(q: Quick, clock: ManualClock) -> None:
    clock.advance(0.0007)
    asked = (clock.now() + 0.25) * 1000
    ids = q.enqueue_many("j", [b"a", b"b"], app="a", tenant="t", delay=0.25)
    for item_id in ids:
        item = q.items.get(ZoneId("a", "t"), item_id)
        assert item is not None and asked - 0.001 <= item.vesting_ms < asked + 1


def test_no_delayed_item_starts_before_its_time_by_the_wall_clock(real_q: Quick) -> None:
    """A running consumer with its timer lookahead (the default) and delays of 20-120 ms:
    each handler starts at or after the wall time its enqueue was called plus its delay."""
    q = real_q
    started: dict[str, float] = {}
    lock = threading.Lock()

    def timed(payload: Any, ctx: Any) -> None:
        at = time.time()
        with lock:
            started[ctx.item_id] = at

    q.job("timed")(timed)
    consumer = q.consumer(ConsumerConfig(idle_sleep_s=0.005))
    consumer.start()
    due: dict[str, float] = {}
    rng = random.Random(5)
    try:
        for n in range(60):
            delay = rng.uniform(0.02, 0.12)
            asked_at = time.time()
            item_id = q.enqueue("timed", n, app="a", tenant=f"t{n % 7}", delay=delay)
            due[item_id] = asked_at + delay
            time.sleep(0.002)
        assert wait_for(lambda: len(started) == len(due), timeout=20)
    finally:
        consumer.stop(5)
    early = {i: round((due[i] - started[i]) * 1000, 3) for i in due if started[i] < due[i]}
    assert early == {}, f"started early by (ms): {early}"

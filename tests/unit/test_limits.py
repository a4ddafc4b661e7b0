"""Per-app rate limits and pool-wide concurrency caps, enforced through the store."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import InvalidArgument
from quickzones.store.limits import AppLimits, RateLimited
from quickzones.store.records import ZoneId


def test_enqueue_rate_limit_throttles_one_app_only(q: Quick, clock: ManualClock) -> None:
    q.set_limits("noisy", AppLimits(enqueues_per_minute=3))
    for _ in range(3):
        q.enqueue("job", b"", app="noisy", tenant="t")
    with pytest.raises(RateLimited) as err:
        q.enqueue("job", b"", app="noisy", tenant="t")
    assert err.value.retry_after_s <= 60
    for _ in range(10):  # another app is not throttled
        q.enqueue("job", b"", app="quiet", tenant="t")
    assert q.zones.count(ZoneId("noisy", "t")) == 3  # the refused enqueue stored nothing
    clock.advance(60)
    q.enqueue("job", b"", app="noisy", tenant="t")
    with pytest.raises(RateLimited):
        q.enqueue_many("job", [b""] * 3, app="noisy", tenant="t")


def test_dispatch_rate_limit(q: Quick, clock: ManualClock) -> None:
    ran: list[str] = []
    q.job("job")(lambda payload, ctx: ran.append(ctx.app))
    q.set_limits("slow", AppLimits(dispatches_per_second=2))
    clock.set(1_700_000_000.0)  # the start of a one-second window
    for _ in range(5):
        q.enqueue("job", b"", app="slow", tenant="t")
        q.enqueue("job", b"", app="fast", tenant="t")
    consumer = q.consumer(ConsumerConfig(in_order=True))
    consumer.run_until_idle()
    assert ran.count("fast") == 5 and ran.count("slow") == 2
    assert consumer.stats["throttled"] >= 1
    clock.advance(1.0)
    consumer.run_until_idle()
    assert ran.count("slow") == 4
    clock.advance(1.0)
    consumer.run_until_idle()
    assert ran.count("slow") == 5


def test_app_concurrency_cap_across_consumers(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)
    q.set_limits("app", AppLimits(max_concurrency=3))
    for i in range(10):
        q.enqueue("job", b"", app="app", tenant=f"t{i}")
    a = q.consumer(ConsumerConfig(in_order=True, dequeue_max=2), name="a")
    b = q.consumer(ConsumerConfig(in_order=True, dequeue_max=2), name="b")
    held = []
    for consumer in (a, b, a, b):
        for ref in consumer.scan_once():
            held += consumer.visit(ref)
    assert len(held) == 3  # the pool holds at most 3 of the app's items at once
    for w in held[:2]:
        (a if w in held else b).execute(w)
    # Finishing frees slots for the other consumer.
    more = []
    for ref in b.scan_once():
        more += b.visit(ref)
    assert 1 <= len(more) <= 2


def test_job_type_pool_cap(q: Quick) -> None:
    seen: list[Any] = []
    q.job("exclusive", pool_max_concurrency=1)(lambda payload, ctx: seen.append(1))
    q.enqueue("exclusive", b"", app="a", tenant="t1")
    q.enqueue("exclusive", b"", app="a", tenant="t2")
    a = q.consumer(ConsumerConfig(in_order=True), name="a")
    b = q.consumer(ConsumerConfig(in_order=True), name="b")
    works_a = [w for ref in a.scan_once() for w in a.visit(ref)]
    assert len(works_a) == 2
    # Pretend another consumer holds the type's only slot.
    assert b._slots.acquire("type", "exclusive", 1, 1) == 1
    outcomes = [a.execute(w) for w in works_a]
    assert outcomes == ["released", "released"] and seen == []
    b._slots.release("type", "exclusive", 1)
    q.clock.sleep(1)  # type: ignore[attr-defined]
    a.run_until_idle()
    assert len(seen) == 2


def test_bad_limits_rejected(q: Quick) -> None:
    with pytest.raises(InvalidArgument):
        q.set_limits("app", AppLimits(enqueues_per_minute=0))
    with pytest.raises(InvalidArgument):
        q.set_limits("", AppLimits())

"""Issue 31 point 6: what a running consumer leaves in the store for ``quick serve``'s
fairness view, history charts and workers page, read back through the store modules
(the dashboard's own tests, in Chromium, are in tests/serve/test_dashboard_fairness.py)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import maintenance
from quickzones.consumer.config import ConsumerConfig
from quickzones.store import heartbeats, pickups
from quickzones.store.heartbeats import Heartbeat
from tests.waiting import wait_for


def test_pickups_per_tenant_and_history_are_summed_atomically(q: Quick, clock: ManualClock) -> None:
    """Two consumers' counts for the same minute add up (atomic adds); minutes past the
    hour kept are cleared by the next flush, so the size stays bounded."""
    now = now_ms(clock)
    m = pickups.minute_of(now)
    fast, slow = pickups.bucket_of(40), pickups.bucket_of(3_000)
    a = {("app", "big", m, fast): 90, ("app", "small", m, slow): 1}
    b = {("app", "big", m, fast): 10, ("app", "small", m, slow): 1}
    pickups.add_counts(q.kv, q.keys, a, now)
    pickups.add_counts(q.kv, q.keys, b, now)
    by_tenant = pickups.tenant_pickups(q.kv, q.keys, "app", now)
    assert by_tenant["big"].total == 100 and by_tenant["big"].percentile(0.99) == 50
    assert by_tenant["small"].total == 2 and by_tenant["small"].percentile(0.5) == 5_000
    history = pickups.app_history(q.kv, q.keys, "app", now)
    assert len(history) == 60 and history[-1] == (m, history[-1][1])
    assert history[-1][1].total == 102 and sum(h.total for _, h in history[:-1]) == 0

    later = now + (pickups.KEEP_MINUTES + 2) * 60_000
    pickups.add_counts(q.kv, q.keys, {("app", "big", pickups.minute_of(later), 0): 1}, later)
    old = pickups.tenant_pickups(q.kv, q.keys, "app", now)
    assert old == {}, "the minutes past the hour kept were cleared"
    assert pickups.percentile_label(None) == "-"
    assert pickups.percentile_label(pickups.OVER) == "> 300 s"
    assert pickups.percentile_label(250) == "≤ 250 ms"


def test_busiest_tenants_are_read_from_each_minutes_top(q: Quick, clock: ManualClock) -> None:
    """Issue 43 point 3: the busiest tenants of the last minutes, read from each minute's
    top entries (not every tenant's counters); a tenant flushed by two consumers, or in
    two minutes, ranks by its sum; the index is cleared with the minutes past the hour."""
    now = now_ms(clock)
    m = pickups.minute_of(now)
    quiet = {("app", f"t{i:03d}", m, 0): 1 for i in range(200)}
    pickups.add_counts(q.kv, q.keys, quiet, now)
    pickups.add_counts(q.kv, q.keys, {("app", "loud", m, 0): 3, ("app", "loud", m, 4): 4}, now)
    pickups.add_counts(q.kv, q.keys, {("app", "loud", m, 2): 5}, now)  # another consumer
    pickups.add_counts(q.kv, q.keys, {("app", "mid", m - 1, 0): 6}, now)
    assert pickups.busiest(q.kv, q.keys, "app", now, first=3) == [
        ("loud", 12), ("mid", 6), ("t000", 1)
    ]  # fmt: skip
    assert pickups.busiest(q.kv, q.keys, "other", now, first=3) == []
    later = now + (pickups.KEEP_MINUTES + 2) * 60_000
    pickups.add_counts(q.kv, q.keys, {("app", "new", pickups.minute_of(later), 0): 1}, later)
    begin, end = q.keys.meta_range("pickup-top", "app", m)
    assert q.transact(lambda tr: tr.get_range(begin, end)) == []


def test_heartbeats_expire_on_their_own(q: Quick, clock: ManualClock) -> None:
    now = now_ms(clock)

    def record(name: str, at: int) -> Heartbeat:
        return Heartbeat(name, "host", 1, at, at, 1000, 8, 2, 5, None, ("ping",), ())

    heartbeats.beat(q.kv, q.keys, record("gone", now), now)
    later = now + heartbeats.EXPIRE_AFTER_MS + 1
    assert [h.consumer_id for h in heartbeats.heartbeats(q.kv, q.keys)] == ["gone"]
    assert heartbeats.heartbeats(q.kv, q.keys)[0].stale(now + 3001)
    heartbeats.beat(q.kv, q.keys, record("alive", later), later)
    assert [h.consumer_id for h in heartbeats.heartbeats(q.kv, q.keys)] == ["alive"]


def test_a_running_consumer_beats_and_counts_its_pickups(real_q: Quick) -> None:
    q = real_q
    ran: list[Any] = []

    @q.job("ping")
    def ping(payload: Any, ctx: Any) -> None:
        ran.append(payload)

    for n in range(20):
        q.enqueue("ping", n, app="app", tenant=f"t{n % 4}")
    consumer = q.consumer(ConsumerConfig(in_order=True), name="c-1", heartbeat_s=0.2)
    consumer.start()
    try:
        assert wait_for(lambda: len(ran) == 20)

        def picked() -> int:
            found = pickups.tenant_pickups(q.kv, q.keys, "app", now_ms(q.clock))
            return sum(h.total for h in found.values())

        assert wait_for(lambda: picked() == 20)
        by_tenant = pickups.tenant_pickups(q.kv, q.keys, "app", now_ms(q.clock))
        assert sorted(by_tenant) == ["t0", "t1", "t2", "t3"]
        assert wait_for(lambda: any(h.scanner for h in heartbeats.heartbeats(q.kv, q.keys)))
        [beat] = heartbeats.heartbeats(q.kv, q.keys)
        assert (beat.consumer_id, beat.workers, beat.scanner) == ("c-1", 8, ("default",))
    finally:
        consumer.stop()
    assert heartbeats.heartbeats(q.kv, q.keys) == [], "a clean stop clears its record"


def test_the_heartbeat_period_is_a_constant_and_a_test_hook_not_a_setting(q: Quick) -> None:
    """Users have no reason to change how often a consumer beats (review point 1): it is
    ``HEARTBEAT_S``, not a ``ConsumerConfig`` field; a test passes a shorter one in."""
    assert "heartbeat_s" not in {f.name for f in dataclasses.fields(ConsumerConfig)}
    assert maintenance.HEARTBEAT_S == 5.0
    q.consumer(name="default").heartbeats.beat_once()
    q.consumer(name="fast", heartbeat_s=0.2).heartbeats.beat_once()
    beats = {h.consumer_id: h.interval_ms for h in heartbeats.heartbeats(q.kv, q.keys)}
    assert beats == {"default": 5000, "fast": 200}


def test_concurrent_flushes_lose_no_count(q: Quick, clock: ManualClock) -> None:
    """Consumers flushing the same tenant's minute at once: atomic adds, nothing lost."""
    now = now_ms(clock)
    key = ("app", "t", pickups.minute_of(now), pickups.bucket_of(5))

    def flush() -> None:
        for _ in range(25):
            pickups.add_counts(q.kv, q.keys, {key: 1}, now)

    threads = [threading.Thread(target=flush) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pickups.tenant_pickups(q.kv, q.keys, "app", now)["t"].total == 200
    assert pickups.app_history(q.kv, q.keys, "app", now)[-1][1].total == 200

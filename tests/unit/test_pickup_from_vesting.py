"""Issue 41 point 10: pickup latency is measured from when an item vested, not from its
enqueue. A reminder enqueued with a 2 s delay and started on time waited for nobody, yet
the fairness view and ``quick_pickup_seconds`` counted its 2 s (2.5 s buckets), and a
retried item's backoff counted as waiting too. Here the store's clock is a manual one, so
each item is picked up the moment it vests: every pickup recorded must be in the first
bucket, however long the delay and the backoff were."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.adapters.http import fairness
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store import pickups
from tests.waiting import wait_for

prometheus_client = pytest.importorskip("prometheus_client")

from quickzones.consumer.metrics import PrometheusObserver  # noqa: E402


def _pickup_seconds(reg: Any, le: str) -> float:
    value = reg.get_sample_value("quick_pickup_seconds_bucket", {"app": "a", "le": le})
    return 0.0 if value is None else float(value)


def test_a_delay_and_a_backoff_are_no_waiting(q: Quick, clock: ManualClock) -> None:
    reg = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(reg, job_types=q.registry)
    runs: list[tuple[str, int]] = []

    @q.job("remind", retry=RetryPolicy(backoff_base_s=3.0, jitter=False))
    def remind(payload: str, ctx: JobContext) -> None:
        runs.append((payload, ctx.attempt))
        if payload == "flaky" and ctx.attempt == 1:
            raise RuntimeError("down for a moment")

    q.enqueue("remind", "later", app="a", tenant="delayed", delay=2)
    q.enqueue("remind", "flaky", app="a", tenant="retried")
    consumer = q.consumer(ConsumerConfig(in_order=True), observer=observer)
    consumer.run_until_idle()  # flaky's first run fails: retried 3 s on
    clock.advance(2)
    consumer.run_until_idle()  # the reminder, at its time
    clock.advance(1)
    consumer.run_until_idle()  # flaky's retry, at the end of its backoff
    assert runs == [("flaky", 1), ("later", 1), ("flaky", 2)]

    # The metric: three pickups, every one under 10 ms (before: the reminder's in the
    # 2.5 s bucket, the retry's in the 5 s one).
    assert _pickup_seconds(reg, "+Inf") == 3
    assert _pickup_seconds(reg, "0.01") == 3, {
        le: _pickup_seconds(reg, le) for le in ("0.01", "0.5", "2.5", "5.0")
    }

    # The fairness view's figures, from the counts the consumer adds to the store.
    consumer.heartbeats.beat_once()
    view = fairness.fairness(q, "a", section="noisy")
    rows = {r.tenant: (r.picked, r.p99_ms) for r in view.sections[0].rows}
    assert rows == {"delayed": (1, 10), "retried": (2, 10)}
    [(_, minute)] = pickups.app_history(q.kv, q.keys, "a", now_ms(clock), minutes=1)
    assert (minute.total, minute.percentile(0.99)) == (3, 10)
    q.close()


def test_a_started_consumer_counts_from_vesting_too(real_q: Quick) -> None:
    """The same on the system clock, through a started consumer: its timer look-ahead
    leases the reminder ahead of its time and starts it then, and the retry runs after
    its backoff; each pickup recorded is under 0.5 s (before: the reminder's 2 s, the
    retry's 1 s, counted as waiting)."""
    q = real_q
    reg = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(reg, job_types=q.registry)
    runs: list[str] = []

    @q.job("remind", retry=RetryPolicy(backoff_base_s=1.0, jitter=False))
    def remind(payload: str, ctx: JobContext) -> None:
        runs.append(payload)
        if payload == "flaky" and ctx.attempt == 1:
            raise RuntimeError("down for a moment")

    q.enqueue("remind", "later", app="a", tenant="delayed", delay=2)
    q.enqueue("remind", "flaky", app="a", tenant="retried")
    consumer = q.consumer(ConsumerConfig(workers=2), observer=observer, heartbeat_s=0.2)
    consumer.start()
    try:
        assert wait_for(lambda: len(runs) == 3, 30)
    finally:
        consumer.stop()  # its last pickup counts are flushed as it stops
    assert _pickup_seconds(reg, "+Inf") == 3
    assert _pickup_seconds(reg, "0.5") == 3, {
        le: _pickup_seconds(reg, le) for le in ("0.5", "1.0", "2.5")
    }
    found = pickups.tenant_pickups(q.kv, q.keys, "a", now_ms(q.clock))
    assert {t: h.total for t, h in found.items()} == {"delayed": 1, "retried": 2}
    assert all((h.percentile(1.0) or 0) <= 500 for h in found.values()), found

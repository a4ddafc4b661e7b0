"""Prometheus metrics per job type and dead letters logged at WARNING (issue 28 point 17):
counters of completed, failed, retried and dead-lettered runs and a run-time histogram per
declared job type; undeclared types share one label value, so a producer cannot grow the
label set."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import Nack
from quickzones.registry import JobContext, RetryPolicy

prometheus_client = pytest.importorskip("prometheus_client")

from quickzones.consumer.metrics import OTHER_JOB_TYPE, PrometheusObserver  # noqa: E402

IN_ORDER = ConsumerConfig(in_order=True, unhandled_grace_s=0)


def _jobs(reg: Any, job_type: str, outcome: str) -> float:
    value = reg.get_sample_value("quick_jobs_total", {"job_type": job_type, "outcome": outcome})
    return 0.0 if value is None else float(value)


def _runs(reg: Any, job_type: str) -> float:
    value = reg.get_sample_value("quick_job_run_seconds_count", {"job_type": job_type})
    return 0.0 if value is None else float(value)


def test_counters_and_run_time_histogram_per_job_type(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    reg = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(reg, job_types=q.registry)

    @q.job("mail")
    def mail(payload: Any, ctx: JobContext) -> None:
        pass

    @q.job("flaky", retry=RetryPolicy(max_attempts=2, backoff_base_s=0.0, jitter=False))
    def flaky(payload: Any, ctx: JobContext) -> None:
        raise RuntimeError("down")

    nacked: list[int] = []

    @q.job("later")
    def later(payload: Any, ctx: JobContext) -> None:
        if not nacked:
            nacked.append(1)
            raise Nack(0.0)

    for n in range(3):
        q.enqueue("mail", {"n": n}, app="a", tenant="t")
    q.enqueue("flaky", {}, app="a", tenant="t")
    q.enqueue("later", {}, app="a", tenant="t")
    consumer = q.consumer(IN_ORDER, observer=observer)
    for _ in range(5):
        consumer.run_until_idle()
        clock.advance(1)
    assert q.dead_letters() != []
    assert _jobs(reg, "mail", "completed") == 3 and _runs(reg, "mail") == 3
    assert _jobs(reg, "flaky", "failed") == 2 and _jobs(reg, "flaky", "retried") == 1
    assert _jobs(reg, "flaky", "dead_lettered") == 1 and _runs(reg, "flaky") == 2
    assert _jobs(reg, "flaky", "completed") == 0
    assert _jobs(reg, "later", "nacked") == 1 and _jobs(reg, "later", "completed") == 1
    assert _runs(reg, "later") == 2
    q.close()


def test_undeclared_job_types_share_one_label(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    reg = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(reg, job_types=q.registry)
    for n in range(20):
        q.enqueue(f"ghost-{n}", {}, app="a", tenant="t")  # nobody runs these types
    q.consumer(IN_ORDER, observer=observer).run_until_idle()
    # Never settled by a consumer that cannot run them, past the grace too (issue 41
    # point 3): no outcome, so no label of theirs.
    assert q.dead_letters() == []
    labels = {
        s.labels["job_type"]
        for metric in reg.collect()
        for s in metric.samples
        if "job_type" in s.labels and s.name.startswith("quick_jobs")
    }
    assert labels <= {OTHER_JOB_TYPE}
    q.close()


def test_dead_lettering_is_logged_at_warning(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    q = Quick.open("memory://", clock=clock)

    @q.job("invoice", retry=RetryPolicy(max_attempts=1))
    def invoice(payload: Any, ctx: JobContext) -> None:
        raise ValueError("no customer")

    q.enqueue("invoice", {}, app="billing", tenant="acme", item_id="inv-7")
    with caplog.at_level(logging.WARNING, logger="quick"):
        q.consumer(IN_ORDER).run_until_idle()
    [record] = [r for r in caplog.records if getattr(r, "quick_event", None) == "dead_lettered"]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    for part in ("app=billing", "tenant=acme", "item_id=inv-7", "job_type=invoice"):
        assert part in text
    assert "no customer" in text

"""Dramatiq actor; the broker URL comes from BENCH_REDIS_URL (set by the bench process)."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.common import record_start

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def job(tenant: str, enq: float, due: float, work_ms: float) -> None:
    record_start(tenant, enq, due, work_ms)

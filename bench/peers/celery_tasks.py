"""Celery app and task; broker from BENCH_REDIS_URL. Settings follow Celery's
"Optimizing" guide for many short tasks: no result backend, a larger prefetch window,
late acks off (the default), and no gossip/mingle/heartbeat traffic (worker flags)."""

from __future__ import annotations

import os

from celery import Celery

from bench.common import record_start

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=16,
    task_default_queue="bench",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.job", ignore_result=True)
def job(tenant: str, enq: float, due: float, work_ms: float) -> None:
    record_start(tenant, enq, due, work_ms)

"""Huey on SQLite; the database file comes from BENCH_HUEY_DB. Results off (no result
rows to write per task)."""

from __future__ import annotations

import os

from huey import SqliteHuey

from bench.common import record_start

huey = SqliteHuey("bench", filename=os.environ.get("BENCH_HUEY_DB", "/tmp/huey.db"), results=False)


@huey.task()
def job(tenant: str, enq: float, due: float, work_ms: float) -> None:
    record_start(tenant, enq, due, work_ms)

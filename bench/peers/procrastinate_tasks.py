"""Procrastinate app and task on PostgreSQL; the DSN comes from BENCH_PG_DSN."""

from __future__ import annotations

import os

import procrastinate

from bench.common import record_start

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_PG_DSN", "postgresql://127.0.0.1/postgres")
    )
)


@app.task(name="bench.job", queue="bench")
def job(tenant: str, enq: float, due: float, work_ms: float) -> None:
    record_start(tenant, enq, due, work_ms)

"""Procrastinate on PostgreSQL: one worker process, ``--concurrency 8`` (another count
with ``concurrency``), LISTEN/NOTIFY on
(its default) so new jobs are pushed, job polling every 0.1 s for scheduled jobs
(``-p 0.1``; the default is 5 s), finished jobs deleted (``--delete-jobs successful``)
so the jobs table does not grow; ``batch_defer`` for batches, ``schedule_in`` for delays."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.peers.base import Peer


class ProcrastinatePeer(Peer):
    name = "procrastinate"
    config = (
        "procrastinate worker --concurrency 8 -p 0.1 --delete-jobs successful (LISTEN/NOTIFY on)"
    )
    batch_api = "Task.batch_defer (one statement)"

    def __init__(self, workdir: Path, dsn: str, concurrency: int = 8) -> None:
        super().__init__(workdir)
        self.concurrency = concurrency
        self.config = self.config.replace("--concurrency 8", f"--concurrency {concurrency}")
        os.environ["BENCH_PG_DSN"] = dsn
        self.env["BENCH_PG_DSN"] = dsn
        self.dsn = dsn
        self.tasks: Any = importlib.import_module("bench.peers.procrastinate_tasks")
        self.tasks.app.open()
        try:
            self.tasks.app.schema_manager.apply_schema()
        except Exception:  # already applied by an earlier run on this cluster
            pass

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.tasks.job.defer(tenant=tenant, enq=t, due=t, work_ms=work_ms)

    def enqueue_batch(self, tenant: str, n: int, work_ms: float = 0.0) -> None:
        t = time.time()
        self.tasks.job.batch_defer(
            *[{"tenant": tenant, "enq": t, "due": t, "work_ms": work_ms} for _ in range(n)]
        )

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.tasks.job.configure(schedule_in={"seconds": delay_s}).defer(
            tenant=tenant, enq=t, due=t + delay_s, work_ms=0.0
        )

    def reset(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs")

    def close(self) -> None:
        super().close()
        self.tasks.app.close()

    def worker_cmd(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "procrastinate",
            "--app",
            "bench.peers.procrastinate_tasks.app",
            "worker",
            "--concurrency",
            str(self.concurrency),
            "-p",
            "0.1",
            "--delete-jobs",
            "successful",
            "-q",
            "bench",
        ]

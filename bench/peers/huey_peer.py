"""Huey on SQLite: one consumer process with 8 worker threads (``-w 8 -k thread``; another
count with ``workers``),
polling from 10 ms backing off to 100 ms (``-d 0.01 -m 0.1``; the default backs off to
10 s), results off; delayed jobs with ``schedule(delay=...)``, which the consumer's
scheduler moves to the queue once per ``-s`` interval (1 s default, its minimum)."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers.base import Peer


class HueyPeer(Peer):
    name = "huey"
    config = "huey_consumer -w 8 -k thread -d 0.01 -m 0.1 -b 1.15 (SqliteHuey, results=False)"

    def __init__(self, workdir: Path, workers: int = 8) -> None:
        super().__init__(workdir)
        self.workers = workers
        self.config = self.config.replace("-w 8", f"-w {workers}")
        db = str(workdir / "huey.db")
        os.environ["BENCH_HUEY_DB"] = db
        self.env["BENCH_HUEY_DB"] = db
        self.tasks: Any = importlib.import_module("bench.peers.huey_tasks")
        self.tasks.huey.storage.filename = db

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.tasks.job(tenant, t, t, work_ms)

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.tasks.job.schedule((tenant, t, t + delay_s, 0.0), delay=delay_s)

    def reset(self) -> None:
        self.tasks.huey.flush()

    def worker_cmd(self) -> list[str]:
        # This interpreter runs Huey's consumer (huey_consumer on PATH may be another
        # Python's, one that cannot import the bench's modules).
        return [
            sys.executable,
            "-m",
            "huey.bin.huey_consumer",
            "bench.peers.huey_tasks.huey",
            "-w",
            str(self.workers),
            "-k",
            "thread",
            "-d",
            "0.01",
            "-m",
            "0.1",
            "-b",
            "1.15",
            "-q",
        ]

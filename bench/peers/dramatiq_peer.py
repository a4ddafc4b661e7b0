"""Dramatiq on Redis: one worker process with 8 threads (``--processes 1 --threads 8``),
no retries; delayed messages with ``send_with_options(delay=ms)``."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench.peers.base import Peer


class DramatiqPeer(Peer):
    name = "dramatiq"
    config = "dramatiq --processes 1 --threads 8 (RedisBroker), max_retries=0"

    def __init__(self, workdir: Path, redis_url: str) -> None:
        super().__init__(workdir)
        os.environ["BENCH_REDIS_URL"] = redis_url
        self.env["BENCH_REDIS_URL"] = redis_url
        self.r = redis.Redis.from_url(redis_url)
        self.tasks: Any = importlib.import_module("bench.peers.dramatiq_tasks")

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.tasks.job.send(tenant, t, t, work_ms)

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.tasks.job.send_with_options(
            args=(tenant, t, t + delay_s, 0.0), delay=int(delay_s * 1000)
        )

    def reset(self) -> None:
        self.r.flushdb()

    def worker_cmd(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dramatiq",
            "bench.peers.dramatiq_tasks",
            "--processes",
            "1",
            "--threads",
            "8",
        ]

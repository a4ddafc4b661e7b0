"""Dramatiq on Redis: one worker process with 8 threads (``--processes 1 --threads 8``;
another count with ``threads``), no retries; delayed messages with
``send_with_options(delay=ms)``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.peers.base import RedisTaskPeer


class DramatiqPeer(RedisTaskPeer):
    name = "dramatiq"
    config = "dramatiq --processes 1 --threads 8 (RedisBroker), max_retries=0"

    tasks_module = "bench.peers.dramatiq_tasks"

    def __init__(self, workdir: Path, redis_url: str, threads: int = 8) -> None:
        super().__init__(workdir, redis_url)
        self.threads = threads
        self.config = self.config.replace("--threads 8", f"--threads {threads}")

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
            str(self.threads),
        ]

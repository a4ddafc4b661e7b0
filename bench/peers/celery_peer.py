"""Celery on Redis: one worker process, thread pool of 8 (``-P threads -c 8``),
prefetch multiplier 16, ignore results, ``--without-gossip --without-mingle
--without-heartbeat``; delayed jobs with ``apply_async(countdown=...)``."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench.peers.base import Peer


class CeleryPeer(Peer):
    name = "celery"
    config = (
        "celery worker -P threads -c 8 --prefetch-multiplier 16 --without-gossip "
        "--without-mingle --without-heartbeat; task_ignore_result"
    )

    def __init__(self, workdir: Path, redis_url: str) -> None:
        super().__init__(workdir)
        os.environ["BENCH_REDIS_URL"] = redis_url
        self.env["BENCH_REDIS_URL"] = redis_url
        self.r = redis.Redis.from_url(redis_url)
        self.tasks: Any = importlib.import_module("bench.peers.celery_tasks")

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.tasks.job.apply_async((tenant, t, t, work_ms))

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.tasks.job.apply_async((tenant, t, t + delay_s, 0.0), countdown=delay_s)

    def reset(self) -> None:
        self.r.flushdb()

    def worker_cmd(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.peers.celery_tasks",
            "worker",
            "-P",
            "threads",
            "-c",
            "8",
            "--prefetch-multiplier",
            "16",
            "-Q",
            "bench",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "WARNING",
        ]

"""Celery on Redis: one worker process, thread pool of 8 (``-P threads -c 8``),
prefetch multiplier 16, ignore results, ``--without-gossip --without-mingle
--without-heartbeat``; delayed jobs with ``apply_async(countdown=...)``."""

from __future__ import annotations

import sys
import time

from bench.peers.base import RedisTaskPeer


class CeleryPeer(RedisTaskPeer):
    name = "celery"
    config = (
        "celery worker -P threads -c 8 --prefetch-multiplier 16 --without-gossip "
        "--without-mingle --without-heartbeat; task_ignore_result"
    )

    tasks_module = "bench.peers.celery_tasks"

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

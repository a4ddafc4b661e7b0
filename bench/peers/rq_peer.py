"""RQ on Redis. One ``SimpleWorker`` (RQ's worker that does not fork a work horse per
job; the fork per job is RQ's isolation default and costs ~ms per job), results not kept
(``result_ttl=0``), scheduler on the worker for delayed jobs, ``enqueue_many`` with a
pipeline for batches."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import redis
from rq import Queue

from bench.peers.base import Peer
from bench.peers.tasks import job


class RQPeer(Peer):
    name = "rq"
    config = "rq worker --worker-class rq.worker.SimpleWorker --with-scheduler; result_ttl=0"
    batch_api = "Queue.enqueue_many (one pipeline)"

    def __init__(self, workdir: Path, redis_url: str) -> None:
        super().__init__(workdir)
        self.url = redis_url
        self.r = redis.Redis.from_url(redis_url)
        self.q = Queue("bench", connection=self.r)

    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None:
        t = time.time()
        self.q.enqueue(job, tenant, t, t, work_ms, result_ttl=0)

    def enqueue_batch(self, tenant: str, n: int, work_ms: float = 0.0) -> None:
        t = time.time()
        self.q.enqueue_many(
            [Queue.prepare_data(job, (tenant, t, t, work_ms), result_ttl=0) for _ in range(n)]
        )

    def enqueue_delayed(self, tenant: str, delay_s: float) -> None:
        t = time.time()
        self.q.enqueue_in(
            timedelta(seconds=delay_s), job, tenant, t, t + delay_s, 0.0, result_ttl=0
        )

    def reset(self) -> None:
        self.r.flushdb()

    def worker_cmd(self) -> list[str]:
        return [
            "rq",
            "worker",
            "-u",
            self.url,
            "--worker-class",
            "rq.worker.SimpleWorker",
            "--with-scheduler",
            "-q",
            "bench",
        ]

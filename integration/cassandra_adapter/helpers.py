"""Shared helpers for the Cassandra zone tests: a schema'd keyspace URL and a deployment."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from integration.cassandra_local import LocalCassandra
from quickzones.adapters.cassandra import CassandraQuick, init_schema, open_cassandra_quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.registry import JobContext, RetryPolicy

# Short leases and sleeps, so a test's consumer finishes in seconds.
FAST = dict(idle_sleep_s=0.01, pointer_lease_s=1.0, min_inactive_s=0.2, item_lease_s=5.0)


def cassandra_url(node: LocalCassandra, session: Any, keyspace: str, **query: str) -> str:
    """A ``cassandra://`` URL for a fresh keyspace with the zone table created."""
    init_schema(session, keyspace, replication=None)
    host = node.contact_points[0]
    options = {"timeout": "5", "connect_timeout": "3", **query}
    qs = "&".join(f"{k}={v}" for k, v in options.items())
    return f"cassandra://{host}:{node.port}/{keyspace}?{qs}"


def open_quick(url: str, tmp_path: Path, **options: Any) -> CassandraQuick:
    return open_cassandra_quick(url, f"sqlite:///{tmp_path / 'pointers.db'}", **options)


def wait_for(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def pointers(q: CassandraQuick) -> int:
    """How many pointers the top-level queue holds (shard 0)."""
    return q.toplevel.count_pointers(0)


class FlakyWork:
    """The end-to-end suites' job: ``work`` on ``q``, whose items with ``flaky`` set fail
    their first attempt (retried after a short backoff); ``runs`` counts every attempt."""

    def __init__(self, q: CassandraQuick) -> None:
        self.q = q
        self.runs: Counter[str] = Counter()
        self.failed_once: set[str] = set()
        self._lock = threading.Lock()
        q.job("work", retry=RetryPolicy(backoff_base_s=0.05, backoff_cap_s=0.1))(self._work)

    def _work(self, payload: Any, ctx: JobContext) -> None:
        with self._lock:
            self.runs[ctx.item_id] += 1
            if payload.get("flaky") and ctx.item_id not in self.failed_once:
                self.failed_once.add(ctx.item_id)
                raise RuntimeError("first attempt fails")

    def enqueue(self, count: int, tenants: int = 5) -> list[str]:
        """``count`` items over ``tenants`` zones of app ``app``; every 7th is flaky."""
        return [
            self.q.enqueue(
                "work", {"n": i, "flaky": i % 7 == 0}, app="app", tenant=f"t{i % tenants}"
            )
            for i in range(count)
        ]

    def each_ran_once(self, ids: list[str]) -> bool:
        """Every item ran once, a flaky one twice (its failed attempt and its retry)."""
        return all(self.runs[i] == (2 if i in self.failed_once else 1) for i in ids)

    def run_all(self, ids: list[str], timeout: float = 30.0) -> dict[str, int]:
        """Run a consumer until every item in ``ids`` ran and the empty zones' pointers
        are collected; returns the consumer's stats."""
        consumer = self.q.consumer(ConsumerConfig(workers=4, managers=2, **FAST))
        consumer.start()
        try:
            wait_for(lambda: set(self.runs) >= set(ids), timeout, "every item to run")
            wait_for(lambda: pointers(self.q) == 0, timeout / 2, "empty zones' pointers")
        finally:
            consumer.stop()
        return dict(consumer.stats)

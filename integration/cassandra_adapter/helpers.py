"""Shared helpers for the Cassandra zone tests: a schema'd keyspace URL and a deployment."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.cassandra import CassandraQuick, init_schema, open_cassandra_quick
from integration.cassandra_local import LocalCassandra


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

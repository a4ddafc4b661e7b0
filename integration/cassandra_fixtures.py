"""pytest plugin: one real Cassandra node per test session.

Enable it from a test module or the root conftest::

    pytest_plugins = ["integration.cassandra_fixtures"]

Fixtures:

``cassandra_node`` (session)
    A started, CQL-ready ``LocalCassandra``: a local JVM from integration/cassandra/lib,
    a testcontainers container when Docker is reachable, or the external cluster named by
    ``CASSANDRA_CONTACT_POINTS``. Stopped (and its temp dir removed) at session end. Tests
    may stop/kill/restart it; the function-scoped fixtures below bring it back first.
``cassandra_session`` (function)
    A cassandra-driver ``Session`` (QUORUM / SERIAL defaults, protocol v5), shut down after
    the test.
``cassandra_keyspace`` (function)
    The name of a fresh SimpleStrategy RF 1 keyspace, dropped after the test.

When java or mvn is missing the Cassandra tests are skipped locally, but fail when
``CI=true`` so a misconfigured CI job cannot go green by skipping them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from integration.cassandra_local import CassandraUnavailable, LocalCassandra
from quickzones.testing.provision import in_ci

READY_TIMEOUT = float(os.environ.get("QUICK_CASSANDRA_READY_TIMEOUT", "180"))


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"Cassandra unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Cassandra unavailable: {reason}")


@pytest.fixture(scope="session")
def cassandra_node() -> Iterator[LocalCassandra]:
    node = LocalCassandra()
    reason = node.unavailable_reason()
    if reason is not None:
        _unavailable(reason)
    try:
        node.ensure_jars()
    except CassandraUnavailable as exc:  # e.g. Maven Central unreachable
        _unavailable(exc.reason)
    try:
        node.start()
        node.wait_ready(READY_TIMEOUT)
    except BaseException:
        node.close()
        raise
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def cassandra_session(cassandra_node: LocalCassandra) -> Iterator[Any]:
    cassandra_node.ensure_running(READY_TIMEOUT)  # an earlier test may have stopped it
    cluster = cassandra_node.cluster()
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


@pytest.fixture
def cassandra_keyspace(cassandra_session: Any) -> Iterator[str]:
    name = f"it_{uuid.uuid4().hex[:12]}"
    cassandra_session.execute(
        f"CREATE KEYSPACE {name} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    try:
        yield name
    finally:
        # Best effort: a test that left the node down must not turn into a teardown error.
        with contextlib.suppress(Exception):
            cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {name}")

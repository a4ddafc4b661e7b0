"""The Cassandra external store (paper section 6.1) with its top-level queue on a real
FoundationDB: items in Cassandra, pointers in ``fdb://`` (issue 14, point 2). The rest of
the Cassandra suite keeps SQLite pointers; this runs its end-to-end case on the engine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from integration.cassandra_adapter.helpers import FlakyWork, cassandra_url, pointers
from integration.cassandra_local import LocalCassandra
from integration.fdb.cluster import session_cluster_file
from quickzones.adapters.cassandra import CassandraQuick, open_cassandra_quick

pytest_plugins = ["integration.cassandra_fixtures"]
pytestmark = [pytest.mark.fdb, pytest.mark.cassandra]


@pytest.fixture
def cq(
    cassandra_node: LocalCassandra, cassandra_session: Any, cassandra_keyspace: str
) -> Iterator[CassandraQuick]:
    url = cassandra_url(cassandra_node, cassandra_session, cassandra_keyspace)
    root = f"quick-cass-{uuid.uuid4().hex}/"
    pointer_url = f"fdb://{quote(session_cluster_file())}?root={quote(root)}"
    q = open_cassandra_quick(url, pointer_url)
    yield q
    q.close()


def test_cassandra_items_with_fdb_pointers_run_end_to_end(cq: CassandraQuick) -> None:
    work = FlakyWork(cq)
    ids = work.enqueue(30)
    assert pointers(cq) == 5
    work.run_all(ids, timeout=60)
    assert work.each_ran_once(ids), work.runs
    assert sum(cq.count("app", f"t{t}") for t in range(5)) == 0

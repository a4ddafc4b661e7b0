"""The shipped zone store contract (:mod:`quickzones.testing.contract.zonestore`) on every zone
store: the KV zones over each KV backend in ``conftest.BACKENDS``, the native SQL zones
(``sqlite:///...?zones=sql``), and Cassandra zones on a local node from
``integration.cassandra_fixtures`` (skipped without java locally, a failure in CI)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.testing.contract.zonestore import *  # noqa: F403 - the contract's test functions
from quickzones.testing.contract.zonestore import ZoneStoreEnv
from tests.contract.conftest import BACKENDS

pytest_plugins = ["integration.cassandra_fixtures"]


def _kv_zones(name: str) -> Callable[[pytest.FixtureRequest, Path], Iterator[ZoneStoreEnv]]:
    def open_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZoneStoreEnv]:
        if not BACKENDS[name].follows_clock:
            pytest.skip(f"{name} reads real time; the contract steps a manual clock")
        clock = ManualClock()
        q = Quick(BACKENDS[name].open(tmp_path, clock), clock=clock)
        try:
            yield ZoneStoreEnv(q.items, q.kv, clock)
        finally:
            q.close()

    return open_env


def _sql_zones(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZoneStoreEnv]:
    """Items and pointers in an SQLite file's own tables (quickzones.store.sql)."""
    from quickzones.backends.sqlite import SQLiteStore

    clock = ManualClock()
    q = Quick(SQLiteStore(tmp_path / "zones.db", clock=clock, zones="sql"), clock=clock)
    try:
        yield ZoneStoreEnv(q.items, q.kv, clock)
    finally:
        q.close()


def _sql_zones_postgres(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZoneStoreEnv]:
    """Items and pointers in a PostgreSQL schema's own tables (quickzones.store.sql)."""
    from quickzones.backends.postgres import PostgresStore
    from quickzones.testing.provision.postgres import postgres_skip_reason
    from tests.postgres import postgres_store_url

    reason = postgres_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    clock = ManualClock()
    store = PostgresStore.from_url(postgres_store_url() + "&zones=sql", clock=clock)
    q = Quick(store, clock=clock)
    try:
        yield ZoneStoreEnv(q.items, q.kv, clock)
    finally:
        q.close()


def _cassandra_zones(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZoneStoreEnv]:
    """Items in a fresh Cassandra keyspace, pointers in a sqlite file."""
    from integration.cassandra_adapter.helpers import cassandra_url
    from quickzones.adapters.cassandra import open_cassandra_quick

    node = request.getfixturevalue("cassandra_node")
    session = request.getfixturevalue("cassandra_session")
    url = cassandra_url(node, session, request.getfixturevalue("cassandra_keyspace"))
    clock = ManualClock(time.time())  # near real time: Cassandra's own timestamps are real
    q = open_cassandra_quick(url, f"sqlite:///{tmp_path / 'pointers.db'}", clock=clock)
    try:
        yield ZoneStoreEnv(q.items, q.kv, clock)
    finally:
        q.close()


# One row per zone store: (id, how to open it, marks). An out-of-tree store adds a row in
# its own suite the same way.
ZONE_STORES = [
    *(pytest.param(_kv_zones(name), id=f"kv-{name}") for name in sorted(BACKENDS)),
    pytest.param(_sql_zones, id="sql-sqlite"),
    pytest.param(_sql_zones_postgres, id="sql-postgres"),
    pytest.param(_cassandra_zones, id="cassandra", marks=pytest.mark.cassandra),
]


@pytest.fixture(params=ZONE_STORES)
def zone_store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZoneStoreEnv]:
    yield from request.param(request, tmp_path)

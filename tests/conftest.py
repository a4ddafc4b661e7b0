"""Fixtures shared by the unit tests: a Quick over each KV backend with a manual clock.

``fdb`` (a real FoundationDB, see ``quickzones.testing.provision.provide_fdb_cluster_file``) is in
``BACKENDS`` only when a cluster can be had; one cluster serves the session, each store URL
gets its own key prefix under a per-session root, cleared when the session ends.
``postgres`` (a real PostgreSQL, ``tests/postgres.py``) joins them the same way: one server
for the session, a schema of its own for each store URL.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.testing.provision import fdb_skip_reason, shared_fdb_cluster_file
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

HAVE_FDB = fdb_skip_reason() is None
# PostgreSQL: a private cluster the session starts when initdb is here (QUICK_REQUIRE_POSTGRES
# in CI makes its absence an error); every store gets a schema of its own.
HAVE_POSTGRES = postgres_skip_reason() is None
BACKENDS = [
    "memory",
    "sqlite",
    "fdbsim",
    *(["fdb"] if HAVE_FDB else []),
    *(["postgres"] if HAVE_POSTGRES else []),
]

# Every fdb:// store of this session lives under this prefix (cleared at the end).
FDB_SESSION_ROOT = f"quick-test-{uuid.uuid4().hex[:12]}/"
_fdb_stores = itertools.count()
_fdb_used = False


def fdb_store_url() -> str:
    """A fresh, empty key prefix on the session's real cluster."""
    global _fdb_used
    cluster = shared_fdb_cluster_file()
    _fdb_used = True
    root = f"{FDB_SESSION_ROOT}{next(_fdb_stores)}/"
    return f"fdb://{quote(str(cluster))}?root={quote(root)}"


def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "fdbsim":
        return "fdbsim://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'quick.db'}"
    if backend == "fdb":
        return fdb_store_url()
    if backend == "postgres":
        return postgres_store_url()
    raise ValueError(backend)


@pytest.fixture(scope="session", autouse=True)
def _clear_fdb_session_root() -> Iterator[None]:
    yield
    if not _fdb_used:
        return
    from quickzones.backends.fdb import FDBOptions, FDBStore
    from quickzones.store.kv import KVTransaction, run

    store = FDBStore(FDBOptions(cluster_file=str(shared_fdb_cluster_file())))
    root = FDB_SESSION_ROOT.encode()

    def clear(tr: KVTransaction) -> None:
        tr.clear_range(root, root + b"\xff")

    run(store, clear)
    store.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(
    params=[pytest.param(b, marks=[pytest.mark.fdb]) if b == "fdb" else b for b in BACKENDS]
)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def q(backend: str, tmp_path: Path, clock: ManualClock) -> Iterator[Quick]:
    quick = Quick.open(store_url(backend, tmp_path), clock=clock)
    yield quick
    quick.close()


@pytest.fixture(
    params=["memory", "sqlite", *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else [])]
)
def live_q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quick]:
    """A client on the system clock, on the stores where a started consumer's timing
    differs most (in process, a file, a real cluster): fairness, weights and limits."""
    quick = Quick.open(store_url(str(request.param), tmp_path))
    yield quick
    quick.close()


@pytest.fixture(params=["memory", "sqlite", *(["postgres"] if HAVE_POSTGRES else [])])
def real_q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quick]:
    """A client on the system clock: a started consumer's threads sleep in real time."""
    url = store_url(str(request.param), tmp_path)
    quick = Quick.open(url)
    yield quick
    quick.close()

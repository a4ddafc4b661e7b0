"""The KV backends the conformance suite runs on.

To add a backend, add an entry to ``BACKENDS``; every test in ``tests/contract`` then runs
on it. A backend that cannot follow an injected clock (a real FDB cluster) sets
``follows_clock=False`` and the tests that step time skip on it, each with that reason.
The real engine (``fdb``) is listed when a cluster can be had (``quickzones.testing.provision``; CI
sets ``QUICK_REQUIRE_FDB=1`` so it must be), and ``postgres`` when a PostgreSQL server can be
(``QUICK_REQUIRE_POSTGRES=1`` in CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quickzones.clock import ManualClock
from quickzones.store.kv import KVStore
from quickzones.testing.provision import fdb_skip_reason, shared_fdb_cluster_file
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[[Path, ManualClock], KVStore]
    follows_clock: bool = True


def _memory(tmp_path: Path, clock: ManualClock) -> KVStore:
    from quickzones.backends.memory import MemoryStore

    return MemoryStore(seed=1234, clock=clock)


def _sqlite(tmp_path: Path, clock: ManualClock) -> KVStore:
    from quickzones.backends.sqlite import SQLiteStore

    return SQLiteStore(tmp_path / "kv.db", clock=clock)


def _fdb_sim(tmp_path: Path, clock: ManualClock) -> KVStore:
    from quickzones.backends.fdb.sim import open_sim_store  # FDBStore's own code over the simulator

    return open_sim_store(clock=clock, seed=1234)


# Every key the suite writes is under this prefix; on a real cluster it is cleared before
# and after each test (the suite's exact key-size test needs the whole 10,000 bytes, so the
# store gets no root prefix of its own).
SUITE_PREFIX = b"conf/"


def _clear_suite_keys(store: KVStore) -> None:
    from quickzones.store.kv import KVTransaction, run

    def clear(tr: KVTransaction) -> None:
        tr.clear_range(SUITE_PREFIX, SUITE_PREFIX + b"\xff")

    run(store, clear)


def _fdb(tmp_path: Path, clock: ManualClock) -> KVStore:
    # The real engine (one cluster for the session); it keeps real time, so the tests that
    # step the clock (the 5 s lifetime, timeouts) skip on it through ``manual_clock``.
    from quickzones.backends.fdb import FDBOptions, FDBStore

    cluster = str(shared_fdb_cluster_file())
    store = FDBStore(FDBOptions(cluster_file=cluster), url=f"fdb://{cluster}")
    _clear_suite_keys(store)
    return store


def _postgres(tmp_path: Path, clock: ManualClock) -> KVStore:
    # A fresh schema on the session's server; the store keeps the injected clock (its
    # versions and the 5 s lifetime are the client's), so the time-stepping tests run.
    from quickzones.backends.postgres import PostgresStore

    return PostgresStore.from_url(postgres_store_url(), clock=clock)


BACKENDS: dict[str, Backend] = {
    "memory": Backend("memory", _memory),
    "sqlite": Backend("sqlite", _sqlite),
    "fdb-sim": Backend("fdb-sim", _fdb_sim),
}
if fdb_skip_reason() is None:  # a real cluster can be had (required under CI)
    BACKENDS["fdb"] = Backend("fdb", _fdb, follows_clock=False)
if postgres_skip_reason() is None:  # a server can be had (required under CI)
    BACKENDS["postgres"] = Backend("postgres", _postgres)


@pytest.fixture(
    params=[
        pytest.param(name, marks=[pytest.mark.fdb]) if name == "fdb" else name
        for name in sorted(BACKENDS)
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kv_store(backend: Backend, tmp_path: Path, clock: ManualClock) -> Iterator[KVStore]:
    store = backend.open(tmp_path, clock)
    try:
        yield store
    finally:
        if backend.name == "fdb":
            _clear_suite_keys(store)
        store.close()


@pytest.fixture
def manual_clock(backend: Backend, clock: ManualClock) -> ManualClock:
    """The clock ``kv_store`` reads; skips on backends whose time cannot be stepped."""
    if not backend.follows_clock:
        pytest.skip(f"{backend.name} reads real time; cannot step its clock")
    return clock

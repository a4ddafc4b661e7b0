"""The KV backends the conformance suite runs on.

To add a backend, add an entry to ``BACKENDS``; every test in ``tests/contract`` then runs
on it. A backend that cannot follow an injected clock (a real FDB cluster) sets
``follows_clock=False`` and the tests that step time skip on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quick_core.clock import ManualClock
from quick_core.kv import KVStore


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[[Path, ManualClock], KVStore]
    follows_clock: bool = True


def _memory(tmp_path: Path, clock: ManualClock) -> KVStore:
    from backends.memory import MemoryStore

    return MemoryStore(seed=1234, clock=clock)


def _sqlite(tmp_path: Path, clock: ManualClock) -> KVStore:
    from backends.sqlite import SQLiteStore

    return SQLiteStore(tmp_path / "kv.db", clock=clock)


def _fdb_sim(tmp_path: Path, clock: ManualClock) -> KVStore:
    from backends.fdb.sim import open_sim_store  # FDBStore's own code over the simulator

    return open_sim_store(clock=clock, seed=1234)


BACKENDS: dict[str, Backend] = {
    "memory": Backend("memory", _memory),
    "sqlite": Backend("sqlite", _sqlite),
    "fdb-sim": Backend("fdb-sim", _fdb_sim),
}


@pytest.fixture(params=sorted(BACKENDS))
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
        store.close()


@pytest.fixture
def manual_clock(backend: Backend, clock: ManualClock) -> ManualClock:
    """The clock ``kv_store`` reads; skips on backends whose time cannot be stepped."""
    if not backend.follows_clock:
        pytest.skip(f"{backend.name} reads real time; cannot step its clock")
    return clock

"""Fixtures shared by the unit tests: a Quick over each KV backend with a manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quick_core.client import Quick
from quick_core.clock import ManualClock

BACKENDS = ["memory", "sqlite", "fdbsim"]


def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "fdbsim":
        return "fdbsim://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'quick.db'}"
    raise ValueError(backend)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def q(backend: str, tmp_path: Path, clock: ManualClock) -> Iterator[Quick]:
    quick = Quick.open(store_url(backend, tmp_path), clock=clock)
    yield quick
    quick.close()

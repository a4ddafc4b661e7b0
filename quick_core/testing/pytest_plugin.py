"""pytest plugin for suites that test code using quick (loaded automatically once
quickzones is installed, through the ``pytest11`` entry point ``quick``).

Fixtures:

``quick_clock``
    A :class:`~quickzones.clock.ManualClock`: time moves only when the test says so.
``quick_store_url``
    The store the ``quick`` fixture opens; ``memory://`` unless a suite overrides it.
``quick``
    A :class:`~quickzones.client.Quick` over ``quick_store_url`` with ``quick_clock``,
    closed after the test. Register handlers on it (or hand it to your app factory),
    enqueue, then drain with ``quick.run_until_idle()`` or :func:`run_until_idle`.
``quick_run_until_idle``
    :func:`quickzones.testing.run_until_idle` bound to the ``quick`` fixture.
``quick_redis_url``, ``quick_memcached_url``, ``quick_cassandra``, ``quick_fdb_cluster_file``
    Session-scoped real servers for election and store tests: a testcontainers container
    when a Docker engine answers, else the server an environment variable names, a local
    binary or a local server (see :mod:`quickzones.testing.provision`); else the test is
    skipped with one line saying what was tried.

Names all start with ``quick`` so they never clash with a suite's own ``clock`` or ``q``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.testing import provision, run_until_idle

T = TypeVar("T")

__all__ = ["run_until_idle"]


@pytest.fixture
def quick_clock() -> ManualClock:
    """A manual clock; ``quick_clock.advance(seconds)`` moves time."""
    return ManualClock()


@pytest.fixture
def quick_store_url() -> str:
    """The store URL the ``quick`` fixture opens; override it to test on SQLite."""
    return "memory://"


@pytest.fixture
def quick(quick_store_url: str, quick_clock: ManualClock) -> Iterator[Quick]:
    """A Quick over ``quick_store_url`` (``memory://``) driven by ``quick_clock``."""
    q = Quick.open(quick_store_url, clock=quick_clock)
    try:
        yield q
    finally:
        q.close()


@pytest.fixture
def quick_run_until_idle(quick: Quick) -> Callable[..., int]:
    """``quick_run_until_idle(advance_clock=True)`` drains ``quick``, delays included."""

    def drain(**options: Any) -> int:
        return run_until_idle(quick, **options)

    return drain


def _serve(provider: Callable[[], AbstractContextManager[T]]) -> Iterator[T]:
    # A provider that cannot find its service raises before its first yield; only then
    # is the test skipped. Failures after start-up are real errors and stay errors.
    manager = provider()
    try:
        value = manager.__enter__()
    except provision.ServiceUnavailable as err:
        pytest.skip(str(err))
    try:
        yield value
    except BaseException as err:
        if not manager.__exit__(type(err), err, err.__traceback__):
            raise
    else:
        manager.__exit__(None, None, None)


@pytest.fixture(scope="session")
def quick_redis_url() -> Iterator[str]:
    """A ``redis://`` URL of a throwaway Redis (for ``RedisElection`` tests)."""
    yield from _serve(provision.provide_redis)


@pytest.fixture(scope="session")
def quick_memcached_url() -> Iterator[str]:
    """A ``memcached://`` URL of a throwaway memcached (for ``MemcachedElection`` tests)."""
    yield from _serve(provision.provide_memcached)


@pytest.fixture(scope="session")
def quick_cassandra() -> Iterator[provision.CassandraEndpoint]:
    """A CQL-ready Cassandra: ``.hosts``, ``.port``, ``.url(keyspace)``, ``.cluster()``."""
    yield from _serve(provision.provide_cassandra)


@pytest.fixture(scope="session")
def quick_fdb_cluster_file() -> Iterator[Path]:
    """The cluster file of a running FoundationDB (open it as ``fdb:///<path>``)."""
    yield from _serve(provision.provide_fdb_cluster_file)

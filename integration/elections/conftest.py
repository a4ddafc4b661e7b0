"""Fixtures for the election tests: real servers, one kit per election implementation.

A missing server binary or driver skips the tests on a laptop but fails them when
``CI=true``, so CI can never go green by silently skipping.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:
    from integration.services import (
        SERVICES,
        Service,
        ServiceUnavailable,
        TLSFiles,
        make_tls_files,
    )
except ImportError:  # plain `pytest` (not `python -m pytest`) leaves the repo off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from integration.services import (
        SERVICES,
        Service,
        ServiceUnavailable,
        TLSFiles,
        make_tls_files,
    )

from quickzones.consumer.election import Election, LocalElection
from quickzones.testing.provision import in_ci

DRIVERS = {"redis": "redis", "memcached": "pymemcache"}


def _unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"{reason} (CI=true: refusing to skip)", pytrace=False)
    pytest.skip(reason)


def _start(kind: str, tls: TLSFiles | None = None) -> Service:
    try:
        __import__(DRIVERS[kind])
    except ImportError:
        _unavailable(f"Python driver {DRIVERS[kind]!r} is not installed")
    try:
        service = SERVICES[kind](tls=tls)
    except ServiceUnavailable as err:
        _unavailable(str(err))
        raise  # unreachable: _unavailable always raises
    try:
        service.start()
    except BaseException:
        service.close()
        raise
    return service


def _open(kind: str, url: str) -> Election:
    if kind == "redis":
        from quickzones.adapters.redis import RedisElection

        return RedisElection.from_url(url)
    from quickzones.adapters.memcached import MemcachedElection

    return MemcachedElection.from_url(url)


@dataclass
class Kit:
    """One election implementation under test, and how to open more candidates on it."""

    kind: str
    server: Service | None
    # How much longer than the requested ttl the server may keep a lease (memcached rounds
    # up to whole seconds plus one tick, see quickzones.adapters.memcached.server_expiry).
    slack: float
    _factory: Callable[[], Election]
    _opened: list[Election] = field(default_factory=list)

    def open(self) -> Election:
        """A new client of the same lease store (for LocalElection: the same table)."""
        election = self._factory()
        self._opened.append(election)
        return election

    _cleanup: list[Callable[[], None]] = field(default_factory=list)
    # The lease store's own clock (seconds), where it has one to ask: a lease expires by
    # the server's clock, so "lost within its TTL" is judged on it, not only on ours.
    server_now: Callable[[], float] | None = None

    def close(self) -> None:
        for election in self._opened:
            election.close()
        for done in self._cleanup:
            done()


def _kit(kind: str, server: Service | None) -> Kit:
    if server is None:
        shared = LocalElection()
        return Kit(kind, None, 0.0, lambda: shared)
    slack = 1.0 if kind == "memcached" else 0.0
    kit = Kit(kind, server, slack, lambda: _open(kind, server.url))
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(server.url)

        def server_now() -> float:
            seconds, micros = client.time()
            return seconds + micros / 1e6

        kit.server_now = server_now
        kit._cleanup.append(client.close)
    return kit


def _store_kit(path: Path) -> Kit:
    """The store's own election on one SQLite file, each candidate on its own Quick (its
    own connection and clock, as a separate process has)."""
    from quickzones.client import Quick
    from quickzones.consumer.store_election import StoreElection

    quicks: list[Quick] = []

    def open_one() -> Election:
        q = Quick.open(f"sqlite:///{path}")
        quicks.append(q)
        return StoreElection(q.kv, q.keys, q.clock)

    def close_all() -> None:
        for q in quicks:
            q.close()

    kit = Kit("store", None, 0.0, open_one)
    kit._cleanup.append(close_all)
    return kit


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Service]:
    service = _start("redis")
    yield service
    service.close()


@pytest.fixture(scope="session")
def memcached_server() -> Iterator[Service]:
    service = _start("memcached")
    yield service
    service.close()


@pytest.fixture(
    params=[
        "local",
        "store",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("memcached", marks=pytest.mark.memcached),
    ]
)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    """Every implementation, on a session-wide server (tests use their own names)."""
    kind: str = request.param
    if kind == "store":
        made = _store_kit(tmp_path / "election.db")
    else:
        server = None if kind == "local" else request.getfixturevalue(f"{kind}_server")
        made = _kit(kind, server)
    yield made
    made.close()


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("memcached", marks=pytest.mark.memcached),
    ]
)
def server_kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    """Server-backed implementations on a private server the test may kill or pause."""
    kind: str = request.param
    server = _start(kind)
    made = _kit(kind, server)
    try:
        yield made
    finally:
        made.close()
        server.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A throwaway CA and server certificate for 127.0.0.1."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        _unavailable("'cryptography' is needed to make test certificates")
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("memcached", marks=pytest.mark.memcached),
    ]
)
def tls_kit(request: pytest.FixtureRequest, tls_files: TLSFiles) -> Iterator[Kit]:
    """Server-backed implementations on a private TLS-only server."""
    kind: str = request.param
    server = _start(kind, tls=tls_files)
    made = _kit(kind, server)
    try:
        yield made
    finally:
        made.close()
        server.close()


@pytest.fixture
def name() -> str:
    """A fresh election name, so tests sharing a server never see each other's leases."""
    return f"test-{uuid.uuid4().hex[:12]}"

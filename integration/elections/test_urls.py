"""Election URLs and driver loading; these need the drivers but no running server."""

from __future__ import annotations

import importlib
import os
import ssl
import sys
from types import ModuleType

import pytest

from quickzones.errors import InvalidStoreURL, MissingDependency
from quickzones.urls import open_election


def _driver(module: str) -> ModuleType:
    # Skip on a laptop without the driver, but never in CI: there a skip would hide a gap.
    if os.environ.get("CI", "").lower() == "true":
        return importlib.import_module(module)
    found: ModuleType = pytest.importorskip(module)
    return found


redis = _driver("redis")
_driver("pymemcache")


def test_redis_url_options_reach_the_driver() -> None:
    from quickzones.adapters.redis import RedisElection

    election = open_election(
        "redis://:s3cret@127.0.0.1:6390/3?socket_timeout=0.2&client_name=scanner&key_prefix=q:"
    )
    try:
        assert isinstance(election, RedisElection)
        kwargs = election._client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("127.0.0.1", 6390, 3)
        assert kwargs["password"] == "s3cret"
        assert kwargs["socket_timeout"] == 0.2
        assert kwargs["socket_connect_timeout"] == 0.5  # our default, not redis-py's 5 s
        assert election._key("scan") == "q:{scan}"
    finally:
        election.close()


def test_rediss_url_passes_tls_options_through() -> None:
    from quickzones.adapters.redis import RedisElection

    election = open_election(
        "rediss://127.0.0.1:6390/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ssl/ca.pem"
    )
    try:
        assert isinstance(election, RedisElection)
        pool = election._client.connection_pool
        assert pool.connection_class is redis.connection.SSLConnection
        assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/ssl/ca.pem"
        assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
        assert pool.connection_kwargs["ssl_check_hostname"] is False
    finally:
        election.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6390/0?sokcet_timeout=1",  # typo
        "redis://127.0.0.1:6390/0?ssl_ca_certs=/x.pem",  # TLS option without rediss://
        "redis:///0",
        "redis://127.0.0.1:99999/0",
        "memcached://127.0.0.1:11211?timeuot=1",
        "memcached://127.0.0.1:11211/path",
        "memcached://user:pw@127.0.0.1:11211",
        "memcached://127.0.0.1:11211?timeout=-1",
        "memcached://127.0.0.1:11211?tls=maybe",
        "memcached://127.0.0.1:11211?tls_cert_reqs=sometimes",
        "memcached://127.0.0.1:11211?tls_ca_certs=/nonexistent/ca.pem",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(InvalidStoreURL):
        open_election(url)


def test_memcached_url_options_reach_the_driver() -> None:
    from quickzones.adapters.memcached import MemcachedElection

    election = open_election("memcached://127.0.0.1:11299?timeout=0.3&max_pool_size=4")
    try:
        assert isinstance(election, MemcachedElection)
        client = election._client
        assert client.server == ("127.0.0.1", 11299)
        assert client.timeout == 0.3
        assert client.connect_timeout == 0.5
        assert client.tls_context is None
    finally:
        election.close()


def test_memcached_default_port_and_tls_context() -> None:
    from quickzones.adapters.memcached import MemcachedElection

    election = open_election("memcached://127.0.0.1?tls=true&tls_cert_reqs=none")
    try:
        assert isinstance(election, MemcachedElection)
        client = election._client
        assert client.server == ("127.0.0.1", 11211)
        assert isinstance(client.tls_context, ssl.SSLContext)
        assert client.tls_context.verify_mode == ssl.CERT_NONE
    finally:
        election.close()


def test_memcached_whole_second_expiry_rounds_up_plus_one_tick() -> None:
    from quickzones.adapters.memcached import server_expiry

    assert server_expiry(0.001) == 2
    assert server_expiry(1) == 2
    assert server_expiry(1.2) == 3
    assert server_expiry(5) == 6


def test_unsafe_memcached_names_are_hashed() -> None:
    from quickzones.adapters.memcached import MemcachedElection

    election = open_election("memcached://127.0.0.1:11299")
    try:
        assert isinstance(election, MemcachedElection)
        assert election._key("cluster-1/shard-0") == "quick:election:cluster-1/shard-0"
        spaced = election._key("has space")
        long = election._key("x" * 300)
        assert spaced.startswith("quick:election:sha256:") and " " not in spaced
        assert len(long) <= 250 - len(":term")
    finally:
        election.close()


@pytest.mark.parametrize(
    ("url", "blocked", "package", "extra"),
    [
        ("redis://127.0.0.1:6390/0", ["redis"], "redis", "redis"),
        (
            "memcached://127.0.0.1:11299",
            ["pymemcache", "pymemcache.client", "pymemcache.client.base", "pymemcache.exceptions"],
            "pymemcache",
            "memcached",
        ),
    ],
)
def test_missing_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, blocked: list[str], package: str, extra: str
) -> None:
    for module in blocked:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingDependency) as info:
        open_election(url)
    assert (info.value.package, info.value.extra) == (package, extra)

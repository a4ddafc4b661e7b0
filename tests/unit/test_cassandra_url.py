"""cassandra:// URL parsing and the missing-driver error, without a Cassandra node."""

from __future__ import annotations

import sys

import pytest

from quickzones.adapters.cassandra.driver import require_driver
from quickzones.adapters.cassandra.url import CassandraURL, parse_cassandra_url
from quickzones.errors import InvalidStoreURL, MissingDependency


def test_defaults() -> None:
    url = parse_cassandra_url("cassandra://db1/queue")
    assert url == CassandraURL(("db1",), 9042, "queue")
    assert url.display == "cassandra://db1:9042/queue"


def test_hosts_ports_and_every_option() -> None:
    url = parse_cassandra_url(
        "cassandra://a:9043, b:9043,[::1]:9043/ks?consistency=local_quorum"
        "&serial_consistency=local_serial&local_dc=eu&timeout=2.5&connect_timeout=1"
        "&protocol_version=4&table=zones_v2"
    )
    assert url == CassandraURL(
        hosts=("a", "b", "::1"),
        port=9043,
        keyspace="ks",
        consistency="LOCAL_QUORUM",
        serial_consistency="LOCAL_SERIAL",
        local_dc="eu",
        timeout_s=2.5,
        connect_timeout_s=1.0,
        protocol_version=4,
        table="zones_v2",
    )


def test_ipv6_contact_points() -> None:
    assert parse_cassandra_url("cassandra://[fe80::1]/ks").hosts == ("fe80::1",)
    assert parse_cassandra_url("cassandra://fe80::1/ks").hosts == ("fe80::1",)
    assert parse_cassandra_url("cassandra://[::1]:9999/ks").port == 9999


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://h/ks", "cassandra:// scheme"),
        ("cassandra:///ks", "no contact points"),
        ("cassandra://h:x/ks", "bad port 'x'"),
        ("cassandra://h:70000/ks", "out of range"),
        ("cassandra://a:9042,b:9043/ks", "different ports"),
        ("cassandra://[::1/ks", "Invalid IPv6 URL"),
        ("cassandra://[::1]x/ks", "bad contact point"),
        ("cassandra://h/", "keyspace '' must be a CQL identifier"),
        ("cassandra://h/1ks", "must be a CQL identifier"),
        ("cassandra://h/" + "k" * 49, "longer than 48"),
        ("cassandra://h/ks?consistency=most", "unknown consistency"),
        ("cassandra://h/ks?serial_consistency=QUORUM", "SERIAL or LOCAL_SERIAL"),
        ("cassandra://h/ks?timeout=soon", "timeout must be seconds"),
        ("cassandra://h/ks?connect_timeout=0", "connect_timeout must be positive"),
        ("cassandra://h/ks?protocol_version=2", "3, 4 or 5"),
        ("cassandra://h/ks?table=bad-name", "must be a CQL identifier"),
        ("cassandra://h/ks?replicas=3", "unknown option 'replicas'"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, fragment: str) -> None:
    with pytest.raises(InvalidStoreURL) as info:
        parse_cassandra_url(url)
    assert fragment in str(info.value)


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "cassandra" or m.startswith("cassandra.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cassandra", None)  # import cassandra -> ImportError
    with pytest.raises(MissingDependency) as info:
        require_driver()
    assert "cassandra-driver" in str(info.value) and "cassandra" in str(info.value)


def test_the_urls_timeouts_reach_the_driver() -> None:
    """Connecting reads the schema on the control connection; the driver's own 2 s for
    those reads failed a connect to a busy node (a CI run's OperationTimedOut). They get
    the URL's request timeout, the handshake its connect timeout."""
    pytest.importorskip("cassandra.cluster")
    from quickzones.adapters.cassandra.driver import make_cluster

    url = parse_cassandra_url("cassandra://127.0.0.1:9042/ks?timeout=7.5&connect_timeout=3")
    cluster = make_cluster(url)  # not connected: nothing listens here
    try:
        assert cluster.control_connection_timeout == 7.5
        assert cluster.connect_timeout == 3.0
        assert cluster.profile_manager.default.request_timeout == 7.5
    finally:
        cluster.shutdown()

"""Smoke tests for the test-owned Cassandra node (integration/cassandra_local.py).

The first group needs no node: launcher mode selection, config rendering, jar bookkeeping.
The second runs against the session node: CRUD at QUORUM, lightweight transactions, SERIAL
reads, and taking the node away (stop, kill -9) and bringing it back with its data.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest

from integration.cassandra_local import (
    CASSANDRA_HOME,
    CassandraStartError,
    LocalCassandra,
    cql_release_version_driver,
    cql_release_version_raw,
    docker_available,
    ensure_jars,
    jars_ready,
    parse_contact_points,
    render_yaml,
)

pytest_plugins = ["integration.cassandra_fixtures"]

# The driver (cassandra-driver, import name cassandra: the cassandra and dev extras) only
# through its guard.
cassandra_driver = pytest.importorskip("cassandra.cluster")
ConsistencyLevel = pytest.importorskip("cassandra").ConsistencyLevel
NoHostAvailable = cassandra_driver.NoHostAvailable
SimpleStatement = pytest.importorskip("cassandra.query").SimpleStatement


def stmt(cql: str, cl: int = ConsistencyLevel.QUORUM) -> SimpleStatement:
    return SimpleStatement(cql, consistency_level=cl)


# -- no node needed ---------------------------------------------------------------------------


def test_external_contact_points_start_nothing() -> None:
    node = LocalCassandra(env={"CASSANDRA_CONTACT_POINTS": "10.0.0.1, 10.0.0.2:9142"})
    assert node.mode == "external"
    assert node.contact_points == ["10.0.0.1", "10.0.0.2"]
    assert node.port == 9142
    assert not node.controllable
    node.start()  # no-op: nothing is launched for an external cluster
    assert node.pid is None
    with pytest.raises(RuntimeError):
        node.restart()


def test_parse_contact_points_default_port() -> None:
    assert parse_contact_points("a,b") == (["a", "b"], 9042)
    assert parse_contact_points("a:1234") == (["a"], 1234)
    with pytest.raises(ValueError):
        parse_contact_points(" , ")


def _fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int) -> None:
    """A `docker` on PATH whose `docker info` exits with exit_code, and testcontainers
    reported importable, so only the engine check decides."""
    exe = tmp_path / "docker"
    exe.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "testcontainers":
            return importlib.machinery.ModuleSpec("testcontainers", None)
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_docker_branch_not_taken_without_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if docker_available():
        pytest.skip("a Docker engine is reachable here")
    assert LocalCassandra(env={}).mode == "local"
    # A docker CLI whose daemon is down (docker info fails) must not select the branch.
    _fake_docker(tmp_path, monkeypatch, exit_code=1)
    assert not docker_available()
    assert LocalCassandra(env={}).mode == "local"


def test_docker_branch_taken_when_engine_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_docker(tmp_path, monkeypatch, exit_code=0)
    assert LocalCassandra(env={}).mode == "docker"
    # ...unless forced local, or an external cluster is named.
    assert LocalCassandra(env={"QUICK_CASSANDRA_MODE": "local"}).mode == "local"
    assert LocalCassandra(env={"CASSANDRA_CONTACT_POINTS": "h"}).mode == "external"


def test_yaml_is_loopback_only(tmp_path: Path) -> None:
    text = render_yaml(tmp_path, 19042, 17000, {"concurrent_reads": 2})
    assert 'listen_address: "127.0.0.1"' in text
    assert 'rpc_address: "127.0.0.1"' in text
    assert "native_transport_port: 19042" in text
    assert '- seeds: "127.0.0.1:17000"' in text
    assert "concurrent_reads: 2" in text


def test_ensure_jars_is_fast_when_resolved() -> None:
    if not jars_ready(CASSANDRA_HOME):
        pytest.skip("jars not resolved yet (the node fixture resolves them)")
    started = time.monotonic()
    lib = ensure_jars()
    assert time.monotonic() - started < 0.5
    assert any(lib.glob("cassandra-all-5.0.*.jar"))


# -- against the session node ----------------------------------------------------------------


def test_node_answers_cql(cassandra_node: LocalCassandra) -> None:
    cassandra_node.ensure_running()
    host, port = cassandra_node.contact_points[0], cassandra_node.port
    assert cassandra_node.release_version is not None
    assert cassandra_node.release_version.startswith("5.0.")
    # The stdlib probe (used when the driver is absent) agrees with the driver.
    assert cql_release_version_raw(host, port) == cql_release_version_driver(host, port)


def test_quorum_write_and_read(cassandra_session: Any, cassandra_keyspace: str) -> None:
    s, ks = cassandra_session, cassandra_keyspace
    s.execute(f"CREATE TABLE {ks}.kv (k text PRIMARY KEY, v int)")
    for i in range(10):
        s.execute(
            SimpleStatement(
                f"INSERT INTO {ks}.kv (k, v) VALUES (%s, %s)",
                consistency_level=ConsistencyLevel.QUORUM,
            ),
            (f"k{i}", i),
        )
    rows = s.execute(stmt(f"SELECT k, v FROM {ks}.kv"))
    assert sorted((r.k, r.v) for r in rows) == [(f"k{i}", i) for i in range(10)]
    one = s.execute(stmt(f"SELECT v FROM {ks}.kv WHERE k = 'k7'")).one()
    assert one.v == 7


def test_lightweight_transactions(cassandra_session: Any, cassandra_keyspace: str) -> None:
    s, ks = cassandra_session, cassandra_keyspace
    s.execute(f"CREATE TABLE {ks}.lease (zone text PRIMARY KEY, owner text, epoch int)")
    ins = f"INSERT INTO {ks}.lease (zone, owner, epoch) VALUES ('z1', %s, 1) IF NOT EXISTS"

    first = s.execute(ins, ("alice",))
    assert first.was_applied
    second = s.execute(ins, ("bob",))
    assert not second.was_applied
    # A failed conditional insert returns the row that blocked it.
    assert second.one().owner == "alice"

    cas = f"UPDATE {ks}.lease SET owner = %s, epoch = %s WHERE zone = 'z1' IF owner = %s"
    ok = s.execute(cas, ("bob", 2, "alice"))
    assert ok.was_applied
    stale = s.execute(cas, ("carol", 3, "alice"))  # alice no longer holds it
    assert not stale.was_applied
    assert stale.one().owner == "bob"

    serial = s.execute(
        stmt(f"SELECT owner, epoch FROM {ks}.lease WHERE zone = 'z1'", ConsistencyLevel.SERIAL)
    ).one()
    assert (serial.owner, serial.epoch) == ("bob", 2)


def _write_rows(s: Any, ks: str, n: int) -> None:
    s.execute(f"CREATE TABLE IF NOT EXISTS {ks}.durable (k int PRIMARY KEY, v text)")
    for i in range(n):
        s.execute(
            SimpleStatement(
                f"INSERT INTO {ks}.durable (k, v) VALUES (%s, %s)",
                consistency_level=ConsistencyLevel.QUORUM,
            ),
            (i, f"v{i}"),
        )


def _count_rows(node: LocalCassandra, ks: str) -> int:
    cluster = node.cluster()
    try:
        rows = cluster.connect().execute(stmt(f"SELECT k FROM {ks}.durable"))
        return len(list(rows))
    finally:
        cluster.shutdown()


def test_stop_fails_fast_then_restart_keeps_data(
    cassandra_node: LocalCassandra, cassandra_session: Any, cassandra_keyspace: str
) -> None:
    if not cassandra_node.controllable:
        pytest.skip("external cluster: not ours to stop")
    node, s, ks = cassandra_node, cassandra_session, cassandra_keyspace
    _write_rows(s, ks, 50)
    port_before = node.port
    try:
        node.stop()
        assert not node.is_running

        # The open session sees its only host go down and fails at once, not after a timeout.
        started = time.monotonic()
        with pytest.raises(NoHostAvailable):
            s.execute(stmt(f"SELECT k FROM {ks}.durable"))
        assert time.monotonic() - started < 5.0

        # A fresh client gets a clear connection error quickly, too.
        started = time.monotonic()
        with pytest.raises(NoHostAvailable, match="Unable to connect"):
            node.cluster(connect_timeout=2.0).connect()
        assert time.monotonic() - started < 10.0

        node.start()
        node.wait_ready()
        assert node.port == port_before  # same contact point for existing clients
        assert _count_rows(node, ks) == 50
    finally:
        node.ensure_running()


def test_kill_9_keeps_acknowledged_writes(
    cassandra_node: LocalCassandra, cassandra_session: Any, cassandra_keyspace: str
) -> None:
    if not cassandra_node.controllable:
        pytest.skip("external cluster: not ours to kill")
    node, ks = cassandra_node, cassandra_keyspace
    _write_rows(cassandra_session, ks, 50)
    try:
        # No drain, no memtable flush: the rows come back from commitlog replay only.
        node.restart(crash=True)
        assert _count_rows(node, ks) == 50
    finally:
        node.ensure_running()


def test_bad_config_fails_fast_with_log_tail(tmp_path: Path) -> None:
    """A JVM that exits during start-up is reported at once, with the reason from its log."""
    node = LocalCassandra(work_dir=tmp_path, yaml_overrides={"no_such_setting": 1})
    if node.unavailable_reason() is not None:
        pytest.skip(node.unavailable_reason() or "")
    node.start()
    started = time.monotonic()
    try:
        with pytest.raises(CassandraStartError, match="exited with code") as info:
            node.wait_ready(timeout=120)
        assert time.monotonic() - started < 60
        assert "no_such_setting" in str(info.value)
    finally:
        node.close()


@pytest.mark.slow
def test_context_manager_cleans_up() -> None:
    """A second, private node: ready on enter; on exit the JVM is gone and its dir removed."""
    probe = LocalCassandra()
    if probe.mode != "local" or probe.unavailable_reason() is not None:
        pytest.skip("needs the local launcher")
    with LocalCassandra() as node:
        assert node.release_version is not None
        pid, work = node.pid, node.work_dir
        assert pid is not None and work is not None and work.is_dir()
    assert not Path(f"/proc/{pid}").exists()
    assert not work.exists()

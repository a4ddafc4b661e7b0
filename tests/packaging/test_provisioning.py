"""Server provisioning lives in one subpackage, ``quickzones.testing.provision``, used by the pytest
plugin's service fixtures and by the integration suites alike: one free-port, one Docker
probe, one die-with-parent, one service error. ``quickzones.testing`` keeps the helpers a
user imports (and re-exports the ``provide_*`` context managers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import quickzones.testing as testing
import quickzones.testing.provision as provision
from quickzones.testing.provision import ports, process

ROOT = Path(__file__).resolve().parents[2]


def test_testing_reexports_what_users_import() -> None:
    # The names docs/testing.md tells users to import from quickzones.testing.
    users_import = ["ServiceUnavailable", "CassandraEndpoint", "provide_redis", "provide_memcached",
                    "provide_cassandra", "provide_fdb_cluster_file"]  # fmt: skip
    for name in users_import:
        assert getattr(testing, name) is getattr(provision, name), name
    assert callable(testing.run_until_idle)


def test_testing_defines_no_provisioning_of_its_own() -> None:
    # Everything server-related in quickzones.testing is provision's object, not a copy.
    for name in testing.__all__:
        obj = getattr(testing, name)
        if name not in ("run_until_idle", "next_vesting_ms"):
            assert obj.__module__.startswith("quickzones.testing.provision"), name


def test_integration_uses_the_one_copy_of_each_helper() -> None:
    sys.path.insert(0, str(ROOT))
    from integration import cassandra_local, services

    assert services.ServiceUnavailable is provision.ServiceUnavailable
    assert services.SERVICES is provision.SERVICES
    assert services.TLSFiles is provision.TLSFiles
    assert cassandra_local.free_port is provision.free_port
    assert cassandra_local.docker_available is provision.docker_available
    assert cassandra_local.parse_contact_points is provision.parse_contact_points
    assert issubclass(cassandra_local.CassandraUnavailable, provision.ServiceUnavailable)
    source = [*(ROOT / "integration").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    for path in source:
        text = path.read_text()
        for copy in ("def free_port", "def docker_available", "prctl(", "def _die_with_parent"):
            assert copy not in text, f"{path.relative_to(ROOT)} has its own {copy!r}"


def test_nothing_found_says_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision.docker, "docker_available", lambda timeout=10.0: False)
    monkeypatch.setattr(process, "find_binary", lambda name: None)
    monkeypatch.setattr(ports, "answers", lambda *a, **k: False)
    monkeypatch.delenv("QUICK_MEMCACHED_URL", raising=False)
    with pytest.raises(provision.ServiceUnavailable) as err, provision.provide_memcached():
        pass
    assert err.value.service == "memcached"
    assert "no QUICK_MEMCACHED_URL, no memcached binary" in str(err.value)


def test_the_environment_names_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provision.docker, "docker_available", lambda timeout=10.0: False)
    monkeypatch.setenv("QUICK_REDIS_URL", "redis://127.0.0.1:1/0")
    with provision.provide_redis() as url:
        assert url == "redis://127.0.0.1:1/0"


@pytest.mark.redis
def test_a_throwaway_redis_answers_and_is_gone_after(monkeypatch: pytest.MonkeyPatch) -> None:
    if process.find_binary("redis-server") is None:
        pytest.skip("no redis-server binary")
    monkeypatch.setattr(provision.docker, "docker_available", lambda timeout=10.0: False)
    monkeypatch.delenv("QUICK_REDIS_URL", raising=False)
    with provision.provide_redis() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert ports.answers("127.0.0.1", port, b"PING\r\n", b"+PONG")
    assert not ports.answers("127.0.0.1", port)


def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # A test process killed with SIGKILL (a CI timeout) must not leave its server behind.
    pidfile = tmp_path / "pid"
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from quickzones.testing.provision.process import spawn
        proc = spawn([sys.executable, "-c", "import time; time.sleep(300)"],
                     workdir=Path({str(tmp_path)!r}), log=Path({str(tmp_path / "log")!r}))
        Path({str(pidfile)!r}).write_text(str(proc.pid))
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        child = int(pidfile.read_text())
        os.kill(child, 0)  # alive
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    for _ in range(200):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived the process that started it")


def test_a_private_postgres_answers_and_dies_with_its_test_process(tmp_path: Path) -> None:
    """The suites' PostgreSQL (quickzones.testing.provision.postgres): a cluster started by
    a test process answers on its port, and goes when that process is SIGKILLed."""
    from quickzones.testing.provision.postgres import find_pg_bin, postgres_required

    if find_pg_bin() is None:
        if postgres_required():
            pytest.fail("QUICK_REQUIRE_POSTGRES is set but there is no initdb", pytrace=False)
        pytest.skip("no PostgreSQL (initdb) here")
    portfile = tmp_path / "port"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from quickzones.testing.provision.postgres import LocalPostgres
        pg = LocalPostgres().start()
        Path({str(portfile)!r}).write_text(str(pg.port))
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(1200):
            if portfile.exists() and portfile.read_text():
                break
            time.sleep(0.05)
        port = int(portfile.read_text())
        assert ports.answers("127.0.0.1", port)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    for _ in range(200):
        if not ports.answers("127.0.0.1", port):
            break
        time.sleep(0.05)
    else:
        pytest.fail("the PostgreSQL server outlived the process that started it")

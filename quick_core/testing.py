"""Helpers for testing code that uses quick: drain a queue deterministically, and get a
throwaway Redis, memcached, Cassandra or FoundationDB for the election and store tests.

The pytest plugin (:mod:`quick_core.pytest_plugin`) wraps these in fixtures; they are plain
functions and context managers so other test runners can use them too. Standard library
only; ``testcontainers`` is used when it is installed and a Docker engine answers.

Each ``provide_*`` context manager tries, in order: a container (Docker), the server an
environment variable names, a local server binary started on a free port, a server already
listening on the default local port; and raises :class:`ServiceUnavailable` naming what it
tried when none works.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quick_core.clock import ManualClock
from quick_core.consumer import ConsumerConfig

if TYPE_CHECKING:
    from quick_core.client import Quick

HOST = "127.0.0.1"


# --- draining --------------------------------------------------------------------------


def run_until_idle(
    quick: Quick,
    *,
    advance_clock: bool = False,
    max_advance_s: float = 86_400.0,
    config: ConsumerConfig | None = None,
) -> int:
    """Run every vested item in this thread, with an in-order scanner and a fixed seed, so
    the same test always runs items in the same order; returns how many ran.

    With ``advance_clock`` (the Quick must use a :class:`ManualClock`) it then moves the
    clock to the next vesting time (delayed items, retry backoffs, nacks) and drains again,
    until no item is left or the next one vests more than ``max_advance_s`` from the start.
    """
    cfg = config or ConsumerConfig(in_order=True, seed=0)
    done = quick.run_until_idle(cfg)
    if not advance_clock:
        return done
    clock = quick.clock
    if not isinstance(clock, ManualClock):
        raise TypeError("advance_clock needs a Quick opened with a ManualClock")
    limit_ms = int((clock.now() + max_advance_s) * 1000)
    ran = done
    for _ in range(10_000):
        nxt = next_vesting_ms(quick)
        if nxt is None or nxt > limit_ms:
            break
        if nxt > clock.now() * 1000:
            clock.set(nxt / 1000 + 0.001)
        elif ran == 0:
            break  # vested, yet the last round ran nothing (held by a lease elsewhere)
        ran = quick.run_until_idle(cfg)
        done += ran
    return done


def next_vesting_ms(quick: Quick) -> int | None:
    """The earliest vesting time of any item in any active zone, or None."""
    from quick_core.admin import active_zones

    times = [quick.zones.min_vesting_ms(z.zone) for z in active_zones(quick)]
    found = [t for t in times if t is not None]
    return min(found) if found else None


# --- finding servers ------------------------------------------------------------------


class ServiceUnavailable(RuntimeError):
    """No way to get the service worked; ``reason`` says what was tried."""

    def __init__(self, service: str, reason: str) -> None:
        super().__init__(f"{service} unavailable: {reason}")
        self.service = service
        self.reason = reason


def find_binary(name: str) -> str | None:
    """Path of ``name`` on PATH or in the usual package locations; None if absent."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"):
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def docker_available() -> bool:
    """True when ``testcontainers`` is importable and a Docker engine answers."""
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]
        import testcontainers  # type: ignore[import-untyped,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the engine means: no Docker here
        return False


def _answers(host: str, port: int, probe: bytes, expect: bytes, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            if probe:
                sock.sendall(probe)
            if not expect:
                return True
            data = b""
            while b"\n" not in data and len(data) < 1024:
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(expect)
    except OSError:
        return False


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel kills the server when the test
    # process dies, so a crashed test run leaves no server behind.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def local_server(
    argv: list[str], ready: Callable[[], bool], *, workdir: Path, timeout: float = 20.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` in ``workdir``, wait until ``ready()``, kill it on exit."""
    log_path = workdir / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            preexec_fn=_die_with_parent,
        )
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{argv[0]} did not start (exit {proc.poll()}):\n{tail}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def _container(image: str, port: int, **env: str) -> Iterator[tuple[str, int]]:
    from testcontainers.core.container import (  # type: ignore[import-untyped,unused-ignore]
        DockerContainer,
    )

    container = DockerContainer(image).with_exposed_ports(port)
    for key, value in env.items():
        container = container.with_env(key, value)
    with container as running:
        yield running.get_container_host_ip(), int(running.get_exposed_port(port))


# --- Redis and memcached -------------------------------------------------------------


def _wait_for(host: str, port: int, probe: bytes, expect: bytes, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(host, port, probe, expect):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing answered on {host}:{port}")
        time.sleep(0.1)


@contextlib.contextmanager
def provide_redis() -> Iterator[str]:
    """A ``redis://`` URL: a container, ``QUICK_REDIS_URL``, a throwaway ``redis-server``,
    or a Redis on 127.0.0.1:6379."""
    ping, pong = b"PING\r\n", b"+PONG"
    if docker_available():
        with _container("redis:7-alpine", 6379) as (host, port):
            _wait_for(host, port, ping, pong)
            yield f"redis://{host}:{port}/0"
        return
    url = os.environ.get("QUICK_REDIS_URL")
    if url:
        yield url
        return
    binary = find_binary("redis-server")
    if binary is not None:
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="quick-redis-") as tmp:
            argv = [binary, "--port", str(port), "--bind", HOST, "--save", "",
                    "--appendonly", "no", "--dir", tmp]  # fmt: skip
            with local_server(argv, lambda: _answers(HOST, port, ping, pong), workdir=Path(tmp)):
                yield f"redis://{HOST}:{port}/0"
        return
    if _answers(HOST, 6379, ping, pong):
        yield f"redis://{HOST}:6379/0"
        return
    raise ServiceUnavailable(
        "redis",
        "no Docker engine (with testcontainers), no QUICK_REDIS_URL, no redis-server "
        "binary, and nothing answers on 127.0.0.1:6379",
    )


@contextlib.contextmanager
def provide_memcached() -> Iterator[str]:
    """A ``memcached://`` URL: a container, ``QUICK_MEMCACHED_URL``, a throwaway
    ``memcached``, or a memcached on 127.0.0.1:11211."""
    probe, expect = b"version\r\n", b"VERSION"
    if docker_available():
        with _container("memcached:1.6-alpine", 11211) as (host, port):
            _wait_for(host, port, probe, expect)
            yield f"memcached://{host}:{port}"
        return
    url = os.environ.get("QUICK_MEMCACHED_URL")
    if url:
        yield url
        return
    binary = find_binary("memcached")
    if binary is not None:
        port = free_port()
        argv = [binary, "-l", HOST, "-p", str(port), "-U", "0", "-m", "16"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root unless told to
        with (
            tempfile.TemporaryDirectory(prefix="quick-memcached-") as tmp,
            local_server(argv, lambda: _answers(HOST, port, probe, expect), workdir=Path(tmp)),
        ):
            yield f"memcached://{HOST}:{port}"
        return
    if _answers(HOST, 11211, probe, expect):
        yield f"memcached://{HOST}:11211"
        return
    raise ServiceUnavailable(
        "memcached",
        "no Docker engine (with testcontainers), no QUICK_MEMCACHED_URL, no memcached "
        "binary, and nothing answers on 127.0.0.1:11211",
    )


# --- Cassandra -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CassandraEndpoint:
    """Where a CQL-ready Cassandra listens."""

    hosts: tuple[str, ...]
    port: int

    def url(self, keyspace: str) -> str:
        """The ``cassandra://`` store URL for ``keyspace``."""
        return f"cassandra://{','.join(self.hosts)}:{self.port}/{keyspace}"

    def cluster(self, **options: Any) -> Any:
        """A cassandra-driver ``Cluster`` (``pip install 'quick-queue[cassandra]'``)."""
        from cassandra.cluster import Cluster

        return Cluster(list(self.hosts), port=self.port, **options)


# A CQL v4 OPTIONS frame; any SUPPORTED reply (opcode 0x06) means the native port is up.
_CQL_OPTIONS = bytes([0x04, 0, 0, 0, 0x05, 0, 0, 0, 0])


def _cql_ready(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.settimeout(2.0)
            sock.sendall(_CQL_OPTIONS)
            header = sock.recv(9)
            return len(header) >= 5 and header[4] == 0x06
    except OSError:
        return False


@contextlib.contextmanager
def provide_cassandra(ready_timeout: float = 180.0) -> Iterator[CassandraEndpoint]:
    """A CQL-ready Cassandra: a ``cassandra:5.0`` container, the cluster
    ``QUICK_CASSANDRA_CONTACT_POINTS`` (``host1,host2[:port]``) names, or a node on
    127.0.0.1:9042. Starting a node from a local install is left to those tools: a JVM
    Cassandra needs a config tree this helper should not guess."""
    if docker_available():
        with _container("cassandra:5.0", 9042, MAX_HEAP_SIZE="512M", HEAP_NEWSIZE="128M") as (
            host,
            port,
        ):
            deadline = time.monotonic() + ready_timeout
            while not _cql_ready(host, port):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Cassandra container did not become CQL-ready")
                time.sleep(1.0)
            yield CassandraEndpoint((host,), port)
        return
    points = os.environ.get("QUICK_CASSANDRA_CONTACT_POINTS") or os.environ.get(
        "CASSANDRA_CONTACT_POINTS"
    )
    if points:
        hosts, _, port_text = points.partition(":")
        yield CassandraEndpoint(tuple(h.strip() for h in hosts.split(",")), int(port_text or 9042))
        return
    if _cql_ready(HOST, 9042):
        yield CassandraEndpoint((HOST,), 9042)
        return
    raise ServiceUnavailable(
        "cassandra",
        "no Docker engine (with testcontainers), no QUICK_CASSANDRA_CONTACT_POINTS, and no "
        "CQL server on 127.0.0.1:9042",
    )


# --- FoundationDB ----------------------------------------------------------------------


def libfdb_c_available() -> bool:
    """True when the FoundationDB client library can be found."""
    return ctypes.util.find_library("fdb_c") is not None or any(
        Path(p).exists()
        for p in ("/usr/lib/libfdb_c.so", "/usr/local/lib/libfdb_c.so", "/usr/lib64/libfdb_c.so")
    )


def _fdb_available(cluster_file: Path, fdbcli: str | None, timeout: int = 10) -> bool:
    if fdbcli is None:
        return cluster_file.exists()  # cannot check; trust the file
    try:
        out = subprocess.run(
            [
                fdbcli,
                "-C",
                str(cluster_file),
                "--exec",
                "status minimal",
                "--timeout",
                str(timeout),
            ],
            capture_output=True,
            text=True,
            timeout=timeout + 5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "available" in out.stdout and "unavailable" not in out.stdout


@contextlib.contextmanager
def provide_fdb_cluster_file(ready_timeout: float = 60.0) -> Iterator[Path]:
    """The path of a cluster file for a running FoundationDB: a container, the file
    ``QUICK_FDB_CLUSTER_FILE``/``FDB_CLUSTER_FILE`` names, a throwaway ``fdbserver``, or
    /etc/foundationdb/fdb.cluster. Needs the client library ``libfdb_c`` to be useful."""
    if not libfdb_c_available():
        raise ServiceUnavailable(
            "foundationdb", "libfdb_c is not installed (install the FoundationDB client package)"
        )
    fdbcli = find_binary("fdbcli")
    if docker_available():
        yield from _fdb_container(ready_timeout)
        return
    named = os.environ.get("QUICK_FDB_CLUSTER_FILE") or os.environ.get("FDB_CLUSTER_FILE")
    if named:
        yield Path(named)
        return
    fdbserver = find_binary("fdbserver")
    if fdbserver is not None and fdbcli is not None:
        yield from _fdb_local(fdbserver, fdbcli, ready_timeout)
        return
    default = Path("/etc/foundationdb/fdb.cluster")
    if default.exists() and _fdb_available(default, fdbcli):
        yield default
        return
    raise ServiceUnavailable(
        "foundationdb",
        "no Docker engine (with testcontainers), no QUICK_FDB_CLUSTER_FILE, no fdbserver and "
        "fdbcli binaries, and no reachable /etc/foundationdb/fdb.cluster",
    )


def _configure_new(fdbcli: str, cluster_file: Path, deadline: float) -> None:
    subprocess.run(
        [fdbcli, "-C", str(cluster_file), "--exec", "configure new single memory",
         "--timeout", "10"],
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    while not _fdb_available(cluster_file, fdbcli, 5):
        if time.monotonic() > deadline:
            raise RuntimeError("FoundationDB did not become available")
        time.sleep(0.5)


def _fdb_local(fdbserver: str, fdbcli: str, ready_timeout: float) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="quick-fdb-") as tmp:
        work = Path(tmp)
        port = free_port()
        cluster_file = work / "fdb.cluster"
        cluster_file.write_text(f"quick:test@{HOST}:{port}\n")
        (work / "data").mkdir()
        (work / "logs").mkdir()
        argv = [fdbserver, "-p", f"{HOST}:{port}", "-C", str(cluster_file),
                "-d", str(work / "data"), "-L", str(work / "logs")]  # fmt: skip
        with local_server(argv, lambda: _answers(HOST, port, b"", b""), workdir=work):
            _configure_new(fdbcli, cluster_file, time.monotonic() + ready_timeout)
            yield cluster_file


def _fdb_container(ready_timeout: float) -> Iterator[Path]:
    from testcontainers.core.container import (  # type: ignore[import-untyped,unused-ignore]
        DockerContainer,
    )

    # Host networking mode makes the server advertise 127.0.0.1:<port>; publishing the same
    # port number on the host makes that address right from outside the container too.
    port = free_port()
    container = (
        DockerContainer("foundationdb/foundationdb:7.3.43")
        .with_env("FDB_NETWORKING_MODE", "host")
        .with_env("FDB_PORT", str(port))
        .with_bind_ports(port, port)
    )
    with container as running, tempfile.TemporaryDirectory(prefix="quick-fdb-") as tmp:
        cluster_file = Path(tmp) / "fdb.cluster"
        cluster_file.write_text(f"docker:docker@{HOST}:{port}\n")
        deadline = time.monotonic() + ready_timeout
        while True:
            code, _ = running.exec(["fdbcli", "--exec", "configure new single memory"])
            code, out = running.exec(["fdbcli", "--exec", "status minimal"])
            if code == 0 and b"is available" in out:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the FoundationDB container did not become available")
            time.sleep(0.5)
        yield cluster_file


__all__ = [
    "CassandraEndpoint",
    "ServiceUnavailable",
    "docker_available",
    "next_vesting_ms",
    "provide_cassandra",
    "provide_fdb_cluster_file",
    "provide_memcached",
    "provide_redis",
    "run_until_idle",
]

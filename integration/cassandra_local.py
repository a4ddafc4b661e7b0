"""A real single-node Apache Cassandra 5.0 for the integration suites, started by the tests.

Three ways to get a node, picked in this order (see ``LocalCassandra.__init__``):

1. ``CASSANDRA_CONTACT_POINTS`` is set: use that external cluster; nothing is started and
   the node cannot be stopped or restarted (``controllable`` is False).
2. A Docker engine answers ``docker info`` and ``testcontainers`` is importable: run the
   ``cassandra:5.0`` image through testcontainers.
3. Otherwise run ``org.apache.cassandra.service.CassandraDaemon`` straight from the jars
   that ``integration/cassandra/pom.xml`` resolves into ``integration/cassandra/lib`` on
   the local JDK 17. The node listens on 127.0.0.1 only, on free ports, with its config,
   data and logs in one temporary directory. ``integration/cassandra/README.md`` has the
   facts behind the flags and the yaml below.

Standard library only; cassandra-driver, when installed, is used for the readiness probe,
and a minimal CQL v4 handshake written here stands in for it when it is not.

``python -m integration.cassandra_local jars|start`` resolves the jars or runs a node in the
foreground (handy for poking at it with cqlsh-less scripts).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from quickzones.testing.provision import (
    ServiceUnavailable,
    answers,
    die_with_parent,
    docker_available,
    free_port,
    parse_contact_points,
)

log = logging.getLogger(__name__)

CASSANDRA_HOME = Path(__file__).resolve().parent / "cassandra"
"""Directory with pom.xml; the jars land in its ``lib/`` (gitignored)."""

MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"
DOCKER_IMAGE = "cassandra:5.0"
CQL_PORT_IN_CONTAINER = 9042
RESOLVED_MARKER = ".resolved"
"""File in lib/ holding the sha256 of the pom.xml it was resolved from (scripts/cassandra-jars
writes the same), so an edited pom triggers a fresh resolution and a half-done one is redone."""

Mode = Literal["local", "docker", "external"]

# Copied from conf/jvm17-server.options: Cassandra reaches into JDK internals (jamm, netty,
# chronicle, its own SecurityManager) and fails at start-up without these on JDK 17.
JPMS_FLAGS: tuple[str, ...] = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)  # fmt: skip

# Tuning for a short-lived test node on a small machine. No AlwaysPreTouch (touching the
# whole heap up front costs seconds), no -Xmn (wrong with G1), no jamm agent (5.0 falls back
# to Unsafe-based sizing; a wrong agent path would kill the JVM instead).
TUNING_FLAGS: tuple[str, ...] = (
    "-XX:+UseG1GC",
    "-XX:+ExitOnOutOfMemoryError",  # also silences a StartupChecks warning
    "-Xss256k",  # Cassandra's own default; many threads, shallow stacks
    "-XX:+UseStringDeduplication",
    "-XX:TieredStopAtLevel=1",  # C1 only: start-up is JIT-bound on 2 cores, tests are short
    "-XX:-UsePerfData",  # no /tmp/hsperfdata file, nothing here reads it
    "-Djava.net.preferIPv4Stack=true",
)

# System properties (CassandraRelevantProperties, 5.0).
SYSTEM_PROPERTIES: Mapping[str, str] = {
    "cassandra-foreground": "yes",  # else the daemon closes stdout/stderr
    "cassandra.skip_wait_for_gossip_to_settle": "0",  # a lone seed has nobody to wait for
    "cassandra.ring_delay_ms": "0",  # nor any ring to learn before it joins
    "cassandra.libjemalloc": "-",  # not installed; skip the lookup and its warning
    "cassandra.load_ring_state": "false",
    # One node: keep the replicated system keyspaces at RF 1 so nothing warns or waits.
    "cassandra.system_distributed.default_rf": "1",
    "cassandra.system_traces.default_rf": "1",
    "cassandra.system_auth.default_rf": "1",
    "cassandra.ignore_kernel_bug_1057843_check": "true",  # only about commitlog direct I/O
    # Graceful stop otherwise sleeps 2 s announcing the shutdown to peers it does not have.
    "cassandra.shutdown_announce_in_ms": "0",
}


class CassandraUnavailable(ServiceUnavailable):
    """The node cannot be provided at all here (no java/mvn, jars unresolvable)."""

    def __init__(self, reason: str) -> None:
        super().__init__("cassandra", reason)


class CassandraStartError(RuntimeError):
    """The node was launched but did not become ready; the message carries the log tail."""


# --------------------------------------------------------------------------------------------
# helpers


def _pom_digest(home: Path) -> str:
    return hashlib.sha256((home / "pom.xml").read_bytes()).hexdigest()


def jars_ready(home: Path = CASSANDRA_HOME) -> bool:
    """lib/ was fully resolved from the current pom.xml."""
    marker = home / "lib" / RESOLVED_MARKER
    try:
        recorded = marker.read_text().split()[0]
    except (OSError, IndexError):
        return False
    return recorded == _pom_digest(home) and any((home / "lib").glob("cassandra-all-*.jar"))


def ensure_jars(home: Path = CASSANDRA_HOME, *, mvn: str | None = None) -> Path:
    """Resolve cassandra-all and its runtime dependencies into ``home/lib`` unless already done.

    Idempotent and cheap when lib/ is current (one sha256 of pom.xml). Resolution goes into a
    scratch directory that replaces lib/ only on success, so an interrupted run or a version
    bump never leaves two Cassandra versions on the classpath. A file lock serialises
    concurrent callers (pytest-xdist workers).
    """
    lib = home / "lib"
    if jars_ready(home):
        return lib
    import fcntl  # POSIX only, like the rest of the local launcher

    lock_path = Path(tempfile.gettempdir()) / f"quick-cassandra-jars-{_pom_digest(home)[:12]}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if jars_ready(home):  # another process finished while we waited
            return lib
        mvn_bin = mvn or shutil.which("mvn")
        if mvn_bin is None:
            raise CassandraUnavailable(
                f"{lib} is missing or stale and Maven (mvn) is not on PATH; "
                "install Maven or run scripts/cassandra-jars where it is"
            )
        # Outside the repo so an interrupted run leaves nothing untracked behind.
        scratch = Path(tempfile.mkdtemp(prefix="quick-cassandra-lib-"))
        started = time.monotonic()
        cmd = [
            mvn_bin, "-B", "-q", "-f", str(home / "pom.xml"),
            "dependency:copy-dependencies", f"-Dcassandra.lib={scratch}",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            tail = (done.stdout + done.stderr)[-4000:]
            raise CassandraUnavailable(f"mvn failed ({done.returncode}):\n{tail}")
        (scratch / RESOLVED_MARKER).write_text(_pom_digest(home) + "\n")
        shutil.rmtree(lib, ignore_errors=True)
        shutil.move(scratch, lib)
        log.info("resolved Cassandra jars into %s in %.1fs", lib, time.monotonic() - started)
    return lib


# --------------------------------------------------------------------------------------------
# CQL readiness probe


def _cql_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _cql_frame(opcode: int, body: bytes, stream: int) -> bytes:
    return struct.pack(">BBhBi", 0x04, 0, stream, opcode, len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by server")
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    _version, _flags, _stream, opcode, length = struct.unpack(">BBhBi", _read_exact(sock, 9))
    return opcode, _read_exact(sock, length)


def _cql_error(body: bytes) -> str:
    code = struct.unpack_from(">i", body, 0)[0]
    (n,) = struct.unpack_from(">H", body, 4)
    return f"CQL error 0x{code:04x}: {body[6 : 6 + n].decode(errors='replace')}"


def cql_release_version_raw(host: str, port: int, timeout: float = 5.0) -> str:
    """``SELECT release_version FROM system.local`` over a bare CQL v4 connection.

    Used when cassandra-driver is not installed: STARTUP, then one QUERY, then parse the
    single-cell Rows result. Only what this one query needs is implemented.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        startup = struct.pack(">H", 1) + _cql_string("CQL_VERSION") + _cql_string("3.0.0")
        sock.sendall(_cql_frame(0x01, startup, 0))
        opcode, body = _read_frame(sock)
        if opcode == 0x00:
            raise ConnectionError(_cql_error(body))
        if opcode != 0x02:  # READY; 0x03 AUTHENTICATE means a password is needed
            raise ConnectionError(f"unexpected CQL opcode 0x{opcode:02x} after STARTUP")
        q = b"SELECT release_version FROM system.local"
        one = 0x0001
        query = struct.pack(">i", len(q)) + q + struct.pack(">HB", one, 0)
        sock.sendall(_cql_frame(0x07, query, 1))
        opcode, body = _read_frame(sock)
        if opcode == 0x00:
            raise ConnectionError(_cql_error(body))
        kind, flags, ncols = struct.unpack_from(">iii", body, 0)
        if opcode != 0x08 or kind != 2 or ncols != 1:
            raise ConnectionError("unexpected CQL result shape")
        pos = 12
        if flags & 0x0002:  # has_more_pages: skip the paging state
            (n,) = struct.unpack_from(">i", body, pos)
            pos += 4 + max(n, 0)
        # One column, so three strings either way: keyspace and table (once up front with
        # the global-table-spec flag, else in the column spec) and the column name.
        for _ in range(3):
            (n,) = struct.unpack_from(">H", body, pos)
            pos += 2 + n
        pos += 2  # column type id (varchar); no parameters for a native type
        (nrows,) = struct.unpack_from(">i", body, pos)
        pos += 4
        if nrows < 1:
            raise ConnectionError("system.local returned no rows")
        (n,) = struct.unpack_from(">i", body, pos)
        return body[pos + 4 : pos + 4 + n].decode()


def cassandra_driver() -> Any:
    """cassandra-driver's names these suites use (import name ``cassandra``, distribution
    ``cassandra-driver``: the ``cassandra`` and ``dev`` extras), imported in this one place
    with one error that names the package to install."""
    try:
        import cassandra
        import cassandra.cluster
        import cassandra.concurrent
        import cassandra.policies
    except ImportError as err:
        raise ImportError(
            "the Cassandra suites need cassandra-driver (import name 'cassandra'): "
            "pip install 'quickzones[cassandra]'"
        ) from err
    return cassandra


def cql_release_version_driver(host: str, port: int, timeout: float = 5.0) -> str:
    """The same query through cassandra-driver: proves the real client can connect."""
    driver = cassandra_driver()
    profile = driver.cluster.ExecutionProfile(
        load_balancing_policy=driver.policies.RoundRobinPolicy(), request_timeout=timeout
    )
    cluster = driver.cluster.Cluster(
        [host],
        port=port,
        protocol_version=driver.ProtocolVersion.V5,
        execution_profiles={driver.cluster.EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
    )
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        return str(row[0])
    finally:
        cluster.shutdown()


def _driver_available() -> bool:
    try:
        return importlib.util.find_spec("cassandra.cluster") is not None
    except ImportError:  # a bare namespace package named "cassandra" on sys.path
        return False


# --------------------------------------------------------------------------------------------
# config files


def render_yaml(
    work: Path, native_port: int, storage_port: int, overrides: Mapping[str, Any] | None = None
) -> str:
    """A minimal cassandra.yaml for one node on 127.0.0.1 (5.0 key names)."""
    settings: dict[str, Any] = {
        "cluster_name": "quick-it",
        "num_tokens": 1,  # one token: less to compute at start, nothing to balance
        "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
        "endpoint_snitch": "SimpleSnitch",  # datacenter1 / rack1, like the driver expects
        "listen_address": "127.0.0.1",
        "rpc_address": "127.0.0.1",
        "storage_port": storage_port,
        "native_transport_port": native_port,
        "start_native_transport": True,
        # batch: a write is acknowledged only after its commitlog sync, so kill -9 loses
        # nothing acknowledged and crash tests are deterministic. With the production default
        # (periodic, 10 s) replay stops at the last sync marker and a kill -9 silently drops
        # acknowledged writes (measured: 12 of 50). Costs ~0.3 ms per write on this disk.
        # Pass yaml_overrides={"commitlog_sync": "periodic", "commitlog_sync_period": "10000ms"}
        # to test against that window instead.
        "commitlog_sync": "batch",
        "commitlog_disk_access_mode": "legacy",  # mmap, no direct I/O (kernel-bug check)
        "commitlog_segment_size": "8MiB",  # fewer/lighter preallocated segments
        "data_file_directories": [str(work / "data")],
        "commitlog_directory": str(work / "commitlog"),
        "saved_caches_directory": str(work / "saved_caches"),
        "hints_directory": str(work / "hints"),
        "cdc_raw_directory": str(work / "cdc_raw"),
        # Nothing to hint to or snapshot for on a throwaway single node.
        "hinted_handoff_enabled": False,
        "auto_snapshot": False,
        "snapshot_before_compaction": False,
        "dynamic_snitch": False,
        # 2 cores: Cassandra sizes these pools for servers; keep thread churn low.
        "concurrent_reads": 4,
        "concurrent_writes": 4,
        "concurrent_counter_writes": 4,
        "concurrent_materialized_view_writes": 2,
        "concurrent_compactors": 1,
        "memtable_flush_writers": 1,
        "compaction_throughput": "0MiB/s",  # unthrottled: tests want compaction done now
        # Off-heap caches default to fractions of the heap; keep the RSS small.
        "file_cache_size": "32MiB",
        "networking_cache_size": "16MiB",
        "key_cache_size": "8MiB",
        "counter_cache_size": "0MiB",
        "prepared_statements_cache_size": "8MiB",
        # A fresh cluster with no 4.x nodes to stay wire-compatible with: 5.0 behaviour.
        "storage_compatibility_mode": "NONE",
        "seed_provider": [
            {
                "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                "parameters": [{"seeds": f"127.0.0.1:{storage_port}"}],
            }
        ],
    }
    for key, value in (overrides or {}).items():
        if value is None:  # None removes a default, e.g. a key another mode forbids
            settings.pop(key, None)
        else:
            settings[key] = value
    return _to_yaml(settings)


def _to_yaml(value: Any, indent: int = 0) -> str:
    """Just enough YAML for the settings above (no PyYAML dependency)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, Mapping | list) and v:
                lines.append(f"{pad}{k}:")
                lines.append(_to_yaml(v, indent + 2).rstrip("\n"))
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping):
                body = _to_yaml(item, indent + 2).rstrip("\n")
                lines.append(f"{pad}- {body.lstrip()}")
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")
    return "\n".join(lines) + "\n"


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list):  # only reached for the empty list
        return "[]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


LOGBACK_XML = """\
<configuration scan="false" debug="false">
  <!-- INFO to a file in the node's temp dir; the shipped conf/logback.xml logs at DEBUG,
       which costs start-up time and disk for nothing the tests read. -->
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <!-- Warnings and worse also reach stdout.log, next to anything the JVM prints itself. -->
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>WARN</level></filter>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %msg%n</pattern></encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
    <appender-ref ref="STDOUT"/>
  </root>
</configuration>
"""


# --------------------------------------------------------------------------------------------
# the node


class LocalCassandra:
    """One Cassandra node for tests: a local JVM, a testcontainers container, or an external
    cluster named by ``CASSANDRA_CONTACT_POINTS``.

    ``start()`` launches, ``wait_ready()`` blocks until CQL answers, ``stop()`` / ``kill()`` /
    ``restart()`` let tests take the node away and bring it back with the same data and
    ports. Use as a context manager to start+wait on enter and stop on exit.
    """

    def __init__(
        self,
        *,
        home: Path = CASSANDRA_HOME,
        work_dir: Path | None = None,
        # -Xms256m rather than 512m: same start-up time, ~270 MiB less RSS (G1 touches the
        # whole initial young gen soon after start); the heap still grows to -Xmx under load.
        heap: tuple[str, str] = ("256m", "768m"),
        extra_jvm_flags: Sequence[str] = (),
        yaml_overrides: Mapping[str, Any] | None = None,
        java: str | None = None,
        mode: Mode | None = None,
        env: Mapping[str, str] | None = None,
        docker_image: str = DOCKER_IMAGE,
    ) -> None:
        env = os.environ if env is None else env
        self.home = home
        self.heap = heap
        self.extra_jvm_flags = tuple(extra_jvm_flags)
        self.yaml_overrides = dict(yaml_overrides or {})
        self.java = java or env.get("CASSANDRA_JAVA") or shutil.which("java")
        self.docker_image = docker_image
        self._contact_points: list[str] = ["127.0.0.1"]
        self._port = 0
        self._storage_port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._container: Any = None
        self._container_down = False  # stopped/killed but kept for restart()
        self._own_work_dir = work_dir is None
        self.work_dir: Path | None = work_dir
        self.release_version: str | None = None
        self.last_ready_seconds: float | None = None
        self._started_at = 0.0

        external = env.get("CASSANDRA_CONTACT_POINTS", "").strip()
        forced = env.get("QUICK_CASSANDRA_MODE")
        chosen: Mode
        if mode is not None:
            chosen = mode
        elif external:
            chosen = "external"
        elif forced == "local":  # escape hatch: local jars even on a box that has Docker
            chosen = "local"
        elif forced == "docker":
            chosen = "docker"
        else:
            chosen = "docker" if docker_available() else "local"
        self.mode: Mode = chosen
        if chosen == "external":
            self._contact_points, self._port = parse_contact_points(
                external, int(env.get("CASSANDRA_PORT", "9042"))
            )

    # -- properties ---------------------------------------------------------------------------

    @property
    def contact_points(self) -> list[str]:
        return list(self._contact_points)

    @property
    def port(self) -> int:
        """The CQL (native transport) port; valid after ``start()`` for local/docker."""
        return self._port

    @property
    def storage_port(self) -> int:
        return self._storage_port

    @property
    def controllable(self) -> bool:
        """False for an external cluster: stop/kill/restart are not ours to do."""
        return self.mode != "external"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        if self.mode == "local":
            return self._proc is not None and self._proc.poll() is None
        if self.mode == "docker":
            return self._container is not None and not self._container_down
        return True

    @property
    def log_dir(self) -> Path | None:
        return self.work_dir / "logs" if self.work_dir is not None else None

    # -- availability --------------------------------------------------------------------------

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot provide a node (None if it can). Cheap: no mvn, no JVM."""
        if self.mode != "local":
            return None
        if self.java is None:
            return "java (JDK 17) is not on PATH"
        if not jars_ready(self.home) and shutil.which("mvn") is None:
            return f"{self.home / 'lib'} is not resolved and mvn is not on PATH"
        return None

    def ensure_jars(self) -> Path | None:
        """Resolve the jars for the local launcher (no-op for docker/external)."""
        if self.mode != "local":
            return None
        return ensure_jars(self.home)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the node and return without waiting; pair with ``wait_ready()``.

        The first start picks free ports and a temp dir; later starts (``restart()``)
        reuse both so data, schema and the clients' contact point stay valid.
        """
        if self.mode == "external":
            return
        if self.is_running:
            raise RuntimeError("Cassandra is already running")
        if self.mode == "docker":
            self._start_docker()
            return
        self._start_local()

    def _start_local(self) -> None:
        if self.java is None:
            raise CassandraUnavailable("java (JDK 17) is not on PATH")
        lib = ensure_jars(self.home)
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="quick-cassandra-"))
        work = self.work_dir
        conf, logs = work / "conf", work / "logs"
        for d in (conf, logs):
            d.mkdir(parents=True, exist_ok=True)
        if not self._port:
            self._port = free_port()
            self._storage_port = free_port()
            while self._storage_port == self._port:
                self._storage_port = free_port()
        (conf / "cassandra.yaml").write_text(
            render_yaml(work, self._port, self._storage_port, self.yaml_overrides)
        )
        (conf / "logback.xml").write_text(LOGBACK_XML)

        cmd = [
            self.java,
            f"-Xms{self.heap[0]}",
            f"-Xmx{self.heap[1]}",
            *TUNING_FLAGS,
            *JPMS_FLAGS,
            f"-XX:ErrorFile={logs}/hs_err_%p.log",
            *(f"-D{k}={v}" for k, v in SYSTEM_PROPERTIES.items()),
            f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
            f"-Dcassandra.storagedir={work}",
            f"-Dcassandra.logdir={logs}",
            f"-Dlogback.configurationFile={conf / 'logback.xml'}",
            f"-Djava.io.tmpdir={work / 'tmp'}",  # JNA unpacks its .so here; must allow exec
            *self.extra_jvm_flags,
            "-cp",
            f"{conf}{os.pathsep}{lib}/*",
            MAIN_CLASS,
        ]
        (work / "tmp").mkdir(exist_ok=True)
        (work / "command.txt").write_text(" ".join(cmd) + "\n")
        stdout = open(logs / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self._proc = subprocess.Popen(
                cmd,
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                # Own session/process group: a Ctrl-C in the terminal does not hit the JVM
                # mid-test, and stop() can signal the group without touching pytest.
                start_new_session=True,
                preexec_fn=die_with_parent,
                env={**os.environ, "LC_ALL": "C"},
            )
        finally:
            stdout.close()
        self._started_at = time.monotonic()
        _LIVE.add(self)
        log.info("started Cassandra pid %s on 127.0.0.1:%s (%s)", self._proc.pid, self._port, work)

    def _start_docker(self) -> None:  # pragma: no cover - needs a Docker engine
        try:  # testcontainers >= 4.x; the old module path only warns (deprecated)
            from testcontainers.community.cassandra import CassandraContainer
        except ImportError:
            from testcontainers.cassandra import CassandraContainer

        if self._container is None:
            if not self._port:
                self._port = free_port()
            # Constructing the container already talks to the engine, hence docker_available().
            container = CassandraContainer(self.docker_image)
            # A fixed host port on loopback only (docker-py's (ip, port) binding form, which
            # with_bind_ports does not accept): nothing is exposed beyond 127.0.0.1, and a
            # restart of the same container comes back on the same contact point.
            container.ports[str(CQL_PORT_IN_CONTAINER)] = ("127.0.0.1", self._port)  # type: ignore[assignment]
            container.with_env("MAX_HEAP_SIZE", "768M").with_env("HEAP_NEWSIZE", "128M")
            # The image appends JVM_EXTRA_OPTS to what CassandraContainer puts in JVM_OPTS.
            container.with_env(
                "JVM_EXTRA_OPTS",
                "-Dcassandra.ring_delay_ms=0 -Dcassandra.shutdown_announce_in_ms=0",
            )
            container.start()
            self._container = container
        else:  # restart(): same container, so same data and the same fixed host port
            self._container.get_wrapped_container().start()
        self._container_down = False
        self._contact_points = ["127.0.0.1"]
        self._started_at = time.monotonic()
        _LIVE.add(self)

    def wait_ready(self, timeout: float = 180.0) -> str:
        """Block until ``SELECT release_version FROM system.local`` answers; return it.

        Polls a TCP connect first (cheap), then the real query. Fails early if the JVM
        exits, and on timeout raises CassandraStartError with the tail of the logs.
        """
        deadline = time.monotonic() + timeout
        probe = cql_release_version_driver if _driver_available() else cql_release_version_raw
        host = self._contact_points[0]
        last_error: BaseException | None = None
        while True:
            if self.mode == "local" and self._proc is not None and self._proc.poll() is not None:
                raise CassandraStartError(
                    f"Cassandra exited with code {self._proc.returncode} before it was ready\n"
                    + self.log_tail()
                )
            if answers(host, self._port):
                try:
                    self.release_version = probe(host, self._port, 5.0)
                except Exception as exc:  # not ready yet: the next poll will tell
                    last_error = exc
                else:
                    if self._started_at:
                        self.last_ready_seconds = time.monotonic() - self._started_at
                    return self.release_version
            if time.monotonic() >= deadline:
                raise CassandraStartError(
                    f"Cassandra on {host}:{self._port} not ready after {timeout:.0f}s "
                    f"(last probe error: {last_error!r})\n" + self.log_tail()
                )
            time.sleep(0.25)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM (Cassandra's shutdown hook drains memtables), SIGKILL after ``grace``."""
        if self.mode == "external":
            return
        if self.mode == "docker":  # pragma: no cover - needs a Docker engine
            if self._container is not None:
                self._container.get_wrapped_container().stop(timeout=int(grace))
                self._container_down = True
            return
        self._signal_and_reap(signal.SIGTERM, grace)

    def kill(self) -> None:
        """SIGKILL without warning: a crash, for durability tests."""
        if self.mode == "external":
            raise RuntimeError("cannot kill an external Cassandra cluster")
        if self.mode == "docker":  # pragma: no cover - needs a Docker engine
            if self._container is not None:
                self._container.get_wrapped_container().kill()
                self._container_down = True
            return
        self._signal_and_reap(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 180.0, *, crash: bool = False) -> str:
        """Stop (or ``crash=True``: kill) and start again on the same data dir and ports."""
        if self.mode == "external":
            raise RuntimeError("cannot restart an external Cassandra cluster")
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()
        return self.wait_ready(timeout)

    def ensure_running(self, timeout: float = 180.0) -> None:
        """Start and wait again if a test stopped the node and failed before restarting it."""
        if self.controllable and not self.is_running:
            self.start()
            self.wait_ready(timeout)

    def _signal_and_reap(self, sig: signal.Signals, grace: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            # The JVM leads its own process group (start_new_session); signal the group so
            # nothing it might spawn outlives it. pid == pgid, and it is ours by construction.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("Cassandra pid %s ignored %s for %.0fs; SIGKILL", proc.pid, sig, grace)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self._proc = None
        _LIVE.discard(self)

    def close(self, *, remove_data: bool = True) -> None:
        """Stop for good: also drop the container or the temp dir we created."""
        if self.mode == "docker":  # pragma: no cover - needs a Docker engine
            if self._container is not None:
                self._container.stop()
                self._container = None
            _LIVE.discard(self)
            return
        discard = remove_data and self._own_work_dir and self.work_dir is not None
        if discard:
            self.kill()  # the data is about to be deleted: skip the drain
        else:
            self.stop()
        if discard and self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None
            self._port = self._storage_port = 0

    # -- diagnostics ---------------------------------------------------------------------------

    def log_tail(self, lines: int = 60) -> str:
        if self.mode == "docker" and self._container is not None:  # pragma: no cover
            out, err = self._container.get_logs()
            text = (out + err).decode(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        if self.log_dir is None:
            return "(no logs)"
        parts = []
        for name in ("stdout.log", "system.log"):
            path = self.log_dir / name
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no logs)"

    def rss_bytes(self) -> int | None:
        """Resident set size of the JVM (Linux /proc), for reporting."""
        if self._proc is None:
            return None
        try:
            for line in Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def cluster(self, **kwargs: Any) -> Any:
        """A cassandra-driver Cluster for this node with the settings that avoid driver
        warnings on 5.0: protocol v5, an explicit DC-aware policy, QUORUM/SERIAL defaults."""
        driver = cassandra_driver()
        policies, consistency = driver.policies, driver.ConsistencyLevel
        profile = driver.cluster.ExecutionProfile(
            load_balancing_policy=policies.TokenAwarePolicy(
                policies.DCAwareRoundRobinPolicy(local_dc=kwargs.pop("local_dc", "datacenter1"))
            ),
            consistency_level=consistency.QUORUM,
            serial_consistency_level=consistency.SERIAL,
            request_timeout=kwargs.pop("request_timeout", 15.0),
        )
        kwargs.setdefault("protocol_version", driver.ProtocolVersion.V5)
        # The driver's 2 s for the schema reads of a connect is missed by a node busy with
        # other tests' keyspaces (one node serves the whole run).
        kwargs.setdefault("control_connection_timeout", 15.0)
        kwargs.setdefault("execution_profiles", {driver.cluster.EXEC_PROFILE_DEFAULT: profile})
        return driver.cluster.Cluster(self.contact_points, port=self.port, **kwargs)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> LocalCassandra:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LocalCassandra(mode={self.mode!r}, contact_points={self._contact_points!r}, "
            f"port={self._port}, running={self.is_running})"
        )


# Nodes started by this process, stopped at interpreter exit if a test run forgot (or
# crashed before) stop(): a stray JVM would hold ~1 GiB and its ports until reboot.
_LIVE: set[LocalCassandra] = set()


@atexit.register
def _stop_leftovers() -> None:
    for node in list(_LIVE):
        with contextlib.suppress(Exception):
            node.stop(grace=10.0)


def _main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    what = argv[0] if argv else "start"
    if what == "jars":
        started = time.monotonic()
        print(ensure_jars(), f"({time.monotonic() - started:.1f}s)")
        return 0
    node = LocalCassandra()
    node.start()
    print("release", node.wait_ready(), f"ready in {node.last_ready_seconds:.1f}s")
    print(f"contact point {node.contact_points[0]}:{node.port}  work dir {node.work_dir}")
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()
    node.close()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

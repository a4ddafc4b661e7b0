"""A FoundationDB for tests: find a build (:func:`find_fdb_dist`), run a one-process
cluster (:class:`LocalFDB`), get a cluster file from whatever is here
(:func:`provide_fdb_cluster_file`, one per session with :func:`shared_fdb_cluster_file`),
and say why real-FDB tests cannot run (:func:`fdb_skip_reason`).

The binding (``fdb``) is imported only by :func:`fdb_binding_mismatch`, when called.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quickzones.testing.provision import docker, ports, process
from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.ports import HOST, free_port
from quickzones.testing.provision.process import spawn, stop_process

# Where a FoundationDB build for this project may sit, relative to an ancestor directory of
# the checkout (CI clones the repo with ``shared/`` beside it: ``../shared/fdb``).
_FDB_DIST_RELATIVE = Path("shared") / "fdb"


@dataclass(frozen=True, slots=True)
class FDBDist:
    """A FoundationDB build: the server, the CLI and (if found) the client library."""

    fdbserver: str
    fdbcli: str
    libfdb_c: str | None


def _ancestors() -> list[Path]:
    seen: list[Path] = []
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if folder not in seen:
                seen.append(folder)
    return seen


def _dist_in(bin_dir: Path) -> FDBDist | None:
    server, cli = bin_dir / "fdbserver", bin_dir / "fdbcli"
    if not (server.is_file() and os.access(server, os.X_OK)):
        return None
    if not (cli.is_file() and os.access(cli, os.X_OK)):
        return None
    lib = bin_dir.parent / "lib" / "libfdb_c.so"
    return FDBDist(str(server), str(cli), str(lib) if lib.is_file() else None)


def find_fdb_dist() -> FDBDist | None:
    """``fdbserver``/``fdbcli`` from ``FDB_BIN_DIR``, then ``shared/fdb/bin`` in an ancestor
    of the working directory or of this package (``../shared/fdb`` from a CI checkout),
    then ``PATH``; None if there is no server binary."""
    from_env = os.environ.get("FDB_BIN_DIR")
    if from_env:
        found = _dist_in(Path(from_env))
        if found is None:
            raise ServiceUnavailable(
                "foundationdb", f"FDB_BIN_DIR={from_env} holds no executable fdbserver and fdbcli"
            )
        return found
    for folder in _ancestors():
        found = _dist_in(folder / _FDB_DIST_RELATIVE / "bin")
        if found is not None:
            return found
    server, cli = process.find_binary("fdbserver"), process.find_binary("fdbcli")
    if server is None or cli is None:
        return None
    found = _dist_in(Path(server).parent)
    return found if found is not None else FDBDist(server, cli, None)


def use_fdb_library(path: str) -> None:
    """Make ``path`` (a libfdb_c) the one the binding loads, here and in child processes:
    ``FDB_LIBRARY_PATH`` is read by ``quickzones.backends.fdb.loader`` before the binding
    opens the library, and ``LD_LIBRARY_PATH`` lets child processes' binding find it (the
    dynamic loader reads ``LD_LIBRARY_PATH`` only at process start, so it cannot help here)."""
    os.environ["FDB_LIBRARY_PATH"] = path
    folder = str(Path(path).parent)
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if folder not in current.split(os.pathsep):
        os.environ["LD_LIBRARY_PATH"] = folder + (os.pathsep + current if current else "")


def libfdb_c_available() -> bool:
    """True when the FoundationDB client library can be found."""
    named = os.environ.get("FDB_LIBRARY_PATH")
    if named and Path(named).is_file():
        return True
    return ctypes.util.find_library("fdb_c") is not None or any(
        Path(p).exists()
        for p in ("/usr/lib/libfdb_c.so", "/usr/local/lib/libfdb_c.so", "/usr/lib64/libfdb_c.so")
    )


def _fdbcli(fdbcli: str, cluster_file: Path, command: str, timeout: int) -> str:
    try:
        out = subprocess.run(
            [fdbcli, "-C", str(cluster_file), "--exec", command, "--timeout", str(timeout)],
            capture_output=True,
            text=True,
            timeout=timeout + 10,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"fdbcli failed: {err}"
    return out.stdout + out.stderr


def _fdb_available(cluster_file: Path, fdbcli: str | None, timeout: int = 10) -> bool:
    if fdbcli is None:
        return cluster_file.exists()  # cannot check; trust the file
    out = _fdbcli(fdbcli, cluster_file, "status minimal", timeout)
    return "The database is available" in out


def fdb_source() -> str | None:
    """Where :func:`provide_fdb_cluster_file` would get a cluster, without starting one:
    ``"env"``, ``"local"`` (an fdbserver binary), ``"docker"``, ``"default"``; or None."""
    if os.environ.get("QUICK_FDB_CLUSTER_FILE") or os.environ.get("FDB_CLUSTER_FILE"):
        return "env"
    if find_fdb_dist() is not None:
        return "local"
    if docker.docker_available():
        return "docker"
    if Path("/etc/foundationdb/fdb.cluster").exists():
        return "default"
    return None


@contextlib.contextmanager
def provide_fdb_cluster_file(
    ready_timeout: float = 60.0, *, storage_engine: str = "memory"
) -> Iterator[Path]:
    """The path of a cluster file for a running FoundationDB, from (in order) the file
    ``QUICK_FDB_CLUSTER_FILE``/``FDB_CLUSTER_FILE`` names; a throwaway ``fdbserver`` (see
    :func:`find_fdb_dist`) on a free 127.0.0.1 port, configured ``single <storage_engine>``
    and killed on exit or with this process; a Docker container; or
    /etc/foundationdb/fdb.cluster. A local build's libfdb_c is selected for the binding
    (:func:`use_fdb_library`)."""
    named = os.environ.get("QUICK_FDB_CLUSTER_FILE") or os.environ.get("FDB_CLUSTER_FILE")
    dist = find_fdb_dist()
    if dist is not None and dist.libfdb_c is not None and "FDB_LIBRARY_PATH" not in os.environ:
        use_fdb_library(dist.libfdb_c)
    if not libfdb_c_available():
        raise ServiceUnavailable(
            "foundationdb", "libfdb_c is not installed (install the FoundationDB client package)"
        )
    if named:
        yield Path(named)
        return
    if dist is not None:
        with LocalFDB(dist, storage_engine=storage_engine) as server:
            server.start(ready_timeout)
            yield server.cluster_file
        return
    if docker.docker_available():
        yield from _fdb_container(ready_timeout)
        return
    default = Path("/etc/foundationdb/fdb.cluster")
    if default.exists() and _fdb_available(default, process.find_binary("fdbcli")):
        yield default
        return
    raise ServiceUnavailable(
        "foundationdb",
        "no QUICK_FDB_CLUSTER_FILE/FDB_CLUSTER_FILE, no fdbserver (FDB_BIN_DIR, "
        "../shared/fdb/bin, PATH), no Docker engine (with testcontainers), and no reachable "
        "/etc/foundationdb/fdb.cluster",
    )


class LocalFDB:
    """A one-process FoundationDB on 127.0.0.1 in a temporary directory, for tests that
    need to kill, pause and restart the server (fault tests) as well as for plain use.

    The server dies with the process that started it (``PR_SET_PDEATHSIG``); ``restart``
    keeps the data directory and the cluster file, so with ``storage_engine="ssd"`` the
    data survives a SIGKILL."""

    def __init__(self, dist: FDBDist, *, storage_engine: str = "memory") -> None:
        self.dist = dist
        self.storage_engine = storage_engine
        self._tmp = tempfile.TemporaryDirectory(prefix="quick-fdb-")
        self.workdir = Path(self._tmp.name)
        self.cluster_file = self.workdir / "fdb.cluster"
        self.proc: subprocess.Popen[bytes] | None = None
        self._configured = False
        self._last_cli = ""  # what fdbcli last said while starting (for a failure report)
        self._new_cluster()

    def _new_cluster(self) -> None:
        """A fresh port, data directory and cluster id. The id is unique so a client still
        retrying an earlier test server that had the same port cannot join this one."""
        for sub in ("data", "logs"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
            (self.workdir / sub).mkdir()
        self.port = free_port()
        self.cluster_file.write_text(f"quick:{os.urandom(8).hex()}@{HOST}:{self.port}\n")
        self._configured = False

    def __enter__(self) -> LocalFDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._tmp.cleanup()

    def _spawn(self) -> None:
        argv = [self.dist.fdbserver, "-p", f"{HOST}:{self.port}",
                "-C", str(self.cluster_file), "-d", str(self.workdir / "data"),
                "-L", str(self.workdir / "logs")]  # fmt: skip
        self.proc = spawn(argv, workdir=self.workdir, log=self.workdir / "server.log")

    def start(self, ready_timeout: float = 60.0) -> None:
        """Start the server; the first time, ``configure new single <engine>``; wait until
        the database is available.

        A first start that does not become available is tried once more from scratch (new
        port, empty data directory): on a loaded machine the first configuration of an
        ``ssd`` cluster has been seen to stall. A restart keeps its data and is not retried.
        """
        if self._configured:
            self._start(ready_timeout)
            return
        try:
            self._start(ready_timeout / 2)
        except RuntimeError as first:
            self.kill()
            self._new_cluster()
            try:
                self._start(ready_timeout / 2)
            except RuntimeError as second:
                raise second from first

    def _start(self, ready_timeout: float) -> None:
        self._spawn()
        deadline = time.monotonic() + ready_timeout
        while not ports.answers(HOST, self.port):
            self._check_alive(deadline)
            time.sleep(0.05)
        if not self._configured:
            out = _fdbcli(self.dist.fdbcli, self.cluster_file,
                          f"configure new single {self.storage_engine}", 30)  # fmt: skip
            self._last_cli = out
            # "Database created"; "already exists" if an earlier attempt got through.
            self._configured = "created" in out or "already exists" in out
        self.wait_available(deadline)

    def wait_available(self, deadline: float) -> None:
        while not _fdb_available(self.cluster_file, self.dist.fdbcli, 5):
            if not self._configured:
                out = _fdbcli(self.dist.fdbcli, self.cluster_file,
                              f"configure new single {self.storage_engine}", 10)  # fmt: skip
                self._last_cli = out
                self._configured = "created" in out or "already exists" in out
            self._check_alive(deadline)
            time.sleep(0.2)

    def _check_alive(self, deadline: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None or time.monotonic() > deadline:
            log = self.workdir / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            status = _fdbcli(self.dist.fdbcli, self.cluster_file, "status", 5)
            raise RuntimeError(
                f"fdbserver on {HOST}:{self.port} did not become available "
                f"(exit {self.proc.poll()}, engine {self.storage_engine}, configured "
                f"{self._configured}):\n{tail}\nfdbcli said: {self._last_cli.strip()}\n"
                f"status: {status.strip()[-1500:]}"
            )

    def kill(self) -> None:
        """SIGKILL the server (a crash); ``start()`` brings it back on the same data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)

    def pause(self) -> None:
        assert self.proc is not None
        stop_process(self.proc)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGKILL late
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(30)


def _fdb_container(ready_timeout: float) -> Iterator[Path]:
    # Host networking mode makes the server advertise 127.0.0.1:<port>; publishing the same
    # port number on the host makes that address right from outside the container too.
    port = free_port()
    container = (
        docker.new_container("foundationdb/foundationdb:7.3.43")
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


_shared_fdb: contextlib.ExitStack | None = None
_shared_fdb_file: Path | None = None


def shared_fdb_cluster_file() -> Path:
    """One cluster for the whole process (a test session), from
    :func:`provide_fdb_cluster_file`, started on first use and stopped at exit (or killed
    with the process). Raises :class:`ServiceUnavailable` when there is none."""
    global _shared_fdb, _shared_fdb_file
    if _shared_fdb_file is None:
        import atexit

        stack = contextlib.ExitStack()
        _shared_fdb_file = stack.enter_context(provide_fdb_cluster_file())
        _shared_fdb = stack
        atexit.register(stack.close)
    return _shared_fdb_file


NO_FDB = (
    "no FoundationDB: set FDB_CLUSTER_FILE, FDB_BIN_DIR (or put the build at ../shared/fdb), "
    "or run a Docker engine"
)


def fdb_required() -> bool:
    """``QUICK_REQUIRE_FDB=1`` (set by ``scripts/test`` when it found a FoundationDB build):
    a missing cluster is then an error, not a skip."""
    return os.environ.get("QUICK_REQUIRE_FDB", "") not in ("", "0")


def fdb_binding_mismatch() -> str | None:
    """Why the installed ``fdb`` binding cannot use the libfdb_c the tests would load (a
    binding newer than the library), or None. Asks the library its maximum API version
    without selecting one, so the process can still use the binding afterwards."""
    dist = find_fdb_dist()
    lib = os.environ.get("FDB_LIBRARY_PATH") or (dist.libfdb_c if dist is not None else None)
    if not lib:
        return None
    try:
        import fdb
    except ImportError:
        return "no FoundationDB Python binding: pip install 'foundationdb>=7.3,<7.4'"
    wanted = getattr(fdb, "LATEST_API_VERSION", None)
    try:
        have = int(ctypes.CDLL(lib).fdb_get_max_api_version())
    except (OSError, AttributeError):
        return None  # cannot tell; the loader's own error will say what is wrong
    if isinstance(wanted, int) and wanted > have:
        line = f"{have // 100}.{have % 100 // 10}"
        upper = f"{(have + 10) // 100}.{(have + 10) % 100 // 10}"
        return (
            f"the FoundationDB binding wants API version {wanted}, the libfdb_c at {lib} "
            f"supports {have}: pip install 'foundationdb>={line},<{upper}'"
        )
    return None


def fdb_skip_reason() -> str | None:
    """Why real-FDB tests cannot run here, or None if they can; decided without starting
    anything, so test collection stays fast. Raises when :func:`fdb_required`."""
    reason = NO_FDB if fdb_source() is None else fdb_binding_mismatch()
    if reason is None:
        return None
    if fdb_required():
        raise ServiceUnavailable("foundationdb", f"QUICK_REQUIRE_FDB is set but {reason}")
    return reason

"""A PostgreSQL for tests: a private cluster (``initdb`` + ``postgres`` on a free
127.0.0.1 port in a temporary folder, :class:`LocalPostgres`), a server the environment
names (``QUICK_POSTGRES_URL``), or testcontainers' Postgres module where a Docker engine
is present (:func:`provide_postgres_url`, one per session with :func:`shared_postgres_url`).

Standard library only: the suites talk to the server through the store (psycopg lives in
``quickzones.backends.postgres``). ``QUICK_REQUIRE_POSTGRES=1`` (set by ``scripts/test``)
makes a missing server an error instead of a skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from quickzones.testing.provision import docker
from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.ports import HOST, answers, free_port
from quickzones.testing.provision.process import die_with_parent, find_binary

ENV_URL = "QUICK_POSTGRES_URL"
NO_POSTGRES = (
    "no PostgreSQL: install Debian's postgresql (initdb), set PG_BIN_DIR or "
    f"{ENV_URL}, or run a Docker engine"
)
# The server refuses to run as root; a root test run starts it as this user.
_SERVER_USER = "postgres"
# A throwaway cluster: no fsync (a machine crash is no test's fault), but a commit still
# writes its WAL before it returns (synchronous_commit stays on), so a server killed as
# ``pg_ctl -m immediate`` does loses no commit it acknowledged, as a production server.
_FAST = ("-c", "fsync=off", "-c", "full_page_writes=off")


def find_pg_bin() -> Path | None:
    """The folder holding ``initdb`` and ``postgres``: ``PG_BIN_DIR``, the newest
    ``/usr/lib/postgresql/*/bin`` (Debian's layout), or where ``initdb`` is on PATH."""
    named = os.environ.get("PG_BIN_DIR")
    if named:
        if not (Path(named) / "initdb").is_file():
            raise ServiceUnavailable("postgresql", f"PG_BIN_DIR={named} holds no initdb")
        return Path(named)
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )
    for version_bin in reversed(versions):
        if (Path(version_bin) / "initdb").is_file() and (Path(version_bin) / "postgres").is_file():
            return Path(version_bin)
    initdb = find_binary("initdb")
    if initdb is None:
        return None
    folder = Path(os.path.realpath(initdb)).parent
    return folder if (folder / "postgres").is_file() else None


def _as_server_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as when this process is root, else None."""
    if os.getuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_SERVER_USER)
    except KeyError:
        entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


class LocalPostgres:
    """A private cluster in a temporary folder, started on a free port and stopped (or
    killed with this process) at the end; :meth:`stop_immediate` and :meth:`start` drive
    it for the hidden-fault tests."""

    def __init__(self, bin_dir: Path | None = None, *, port: int | None = None) -> None:
        found = bin_dir or find_pg_bin()
        if found is None:
            raise ServiceUnavailable("postgresql", NO_POSTGRES)
        self.bin_dir = found
        self.port = port or free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="quick-postgres-"))
        self.data = self.workdir / "data"
        self._log = self.workdir / "server.log"
        self._user = _as_server_user()
        if self._user is not None:
            os.chown(self.workdir, *self._user)
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused: list[int] = []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/postgres"

    def _preexec(self) -> None:
        if self._user is not None:
            os.setgid(self._user[1])
            os.setuid(self._user[0])
        die_with_parent()  # after setuid, which clears the parent-death signal

    def _run(self, argv: list[str]) -> None:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=self.workdir,
            preexec_fn=self._preexec,
            timeout=120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({out.returncode}): {out.stdout}{out.stderr}")

    def start(self, timeout: float = 60.0) -> LocalPostgres:
        """initdb on first use, then the server in the foreground of a child process."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        if not (self.data / "PG_VERSION").exists():
            initdb = str(self.bin_dir / "initdb")
            self._run([initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust",
                       "-E", "UTF8", "--locale=C", "--no-sync"])  # fmt: skip
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data), "-h", HOST,
                "-p", str(self.port), "-k", str(self.workdir), "-c", "max_connections=300",
                *_FAST]  # fmt: skip
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=self._preexec,
            )
        deadline = time.monotonic() + timeout
        ready = str(self.bin_dir / "pg_isready")
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{self.log_tail()}")
            if answers(HOST, self.port) and subprocess.run(
                [ready, "-q", "-h", HOST, "-p", str(self.port), "-U", "postgres"],
                check=False,
            ).returncode == 0:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not answer within {timeout} s:\n{self.log_tail()}")

    def stop_immediate(self) -> None:
        """``pg_ctl -m immediate``: SIGQUIT, no shutdown checkpoint (a crash, WAL replay
        at the next start)."""
        self._signal(signal.SIGQUIT)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def pause(self, *, backends: bool = False) -> None:
        """SIGSTOP the postmaster: connections made meanwhile wait (it accepts, never
        answers) while the backends already serving keep working. With ``backends``,
        every server process too (a hung server: open connections stall as well)."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the server is not running")
        pids = [self._proc.pid, *(_children(self._proc.pid) if backends else [])]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a backend that just ended
                os.kill(pid, signal.SIGSTOP)
        self._paused = pids

    def resume(self) -> None:
        """SIGCONT what :meth:`pause` stopped."""
        pids, self._paused = self._paused, []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self.resume()  # a paused server would not hear the stop
        self.stop_immediate()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the server's backends and helpers), from
    /proc (Linux; none elsewhere)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(Path(stat).parent.name))
    return found


def postgres_source() -> str | None:
    """Where :func:`provide_postgres_url` would get a server, without starting one:
    ``"env"``, ``"local"`` (initdb here), ``"docker"``; or None."""
    if os.environ.get(ENV_URL):
        return "env"
    if find_pg_bin() is not None:
        return "local"
    if docker.docker_available():
        return "docker"
    return None


@contextlib.contextmanager
def provide_postgres_url() -> Iterator[str]:
    """The URL of a running PostgreSQL (database ``postgres``, a user that may create
    schemas): the one ``QUICK_POSTGRES_URL`` names; a private cluster (:class:`LocalPostgres`)
    stopped on exit; or testcontainers' Postgres module."""
    named = os.environ.get(ENV_URL)
    if named:
        yield named
        return
    if find_pg_bin() is not None:
        server = LocalPostgres()
        try:
            server.start()
            yield server.url
        finally:
            server.close()
        return
    if docker.docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield str(container.get_connection_url())
        return
    raise ServiceUnavailable("postgresql", NO_POSTGRES)


_shared: contextlib.ExitStack | None = None
_shared_url: str | None = None


def shared_postgres_url() -> str:
    """One server for the whole process (a test session), started on first use and
    stopped at exit."""
    global _shared, _shared_url
    if _shared_url is None:
        import atexit

        stack = contextlib.ExitStack()
        _shared_url = stack.enter_context(provide_postgres_url())
        _shared = stack
        atexit.register(stack.close)
    return _shared_url


def postgres_required() -> bool:
    """``QUICK_REQUIRE_POSTGRES=1`` (set by ``scripts/test``): no server is an error."""
    return os.environ.get("QUICK_REQUIRE_POSTGRES", "") not in ("", "0")


def postgres_skip_reason() -> str | None:
    """Why PostgreSQL tests cannot run here, or None; decided without starting anything.
    Raises when :func:`postgres_required`."""
    if postgres_source() is not None:
        return None
    if postgres_required():
        raise ServiceUnavailable("postgresql", f"QUICK_REQUIRE_POSTGRES is set but {NO_POSTGRES}")
    return NO_POSTGRES

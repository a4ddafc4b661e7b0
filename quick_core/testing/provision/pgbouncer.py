"""A PgBouncer for tests: Debian's ``pgbouncer`` in transaction pooling mode in front of a
PostgreSQL server (:class:`LocalPgBouncer`), on a free 127.0.0.1 port, with trust
authentication (a user list naming the server's user), started and stopped like the other
servers (:class:`~quickzones.testing.provision.process.Service`).

Transaction pooling is the mode that breaks what assumes one server session per client
connection (LISTEN, session settings and locks, and before PgBouncer 1.21 server-side
prepared statements): the mode quick must work behind (issue 42 point 2).

Standard library only. ``QUICK_REQUIRE_POSTGRES=1`` (set by ``scripts/test``) makes a
missing ``pgbouncer`` an error instead of a skip, as it does a missing PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import struct
import subprocess
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.ports import HOST
from quickzones.testing.provision.postgres import postgres_required, shared_postgres_url
from quickzones.testing.provision.process import Service, die_with_parent, find_binary

NO_PGBOUNCER = "no pgbouncer: install Debian's pgbouncer (apt-get install pgbouncer)"
# Server connections per (user, database): enough for a few processes' pools (each store
# object keeps up to 16 connections, most of them idle between transactions), well under
# the test server's max_connections.
POOL_SIZE = 40
# PgBouncer refuses to run as root; a root test run starts it as this user.
_RUN_AS = "postgres"
# The SSLRequest message: PgBouncer without TLS answers it with one byte, "N".
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)


class LocalPgBouncer(Service):
    """``pgbouncer`` with ``pool_mode = transaction`` in front of ``server_url``'s server,
    reached at :attr:`url` (the same user and database, another port)."""

    binary_name, service_name = "pgbouncer", "pgbouncer"

    def __init__(
        self,
        server_url: str,
        *,
        port: int | None = None,
        pool_size: int = POOL_SIZE,
        start_timeout: float = 20.0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout)
        parts = urlsplit(server_url)
        self.user = unquote(parts.username or "postgres")
        self.database = unquote(parts.path.lstrip("/") or self.user)
        self._server = (parts.hostname or HOST, parts.port or 5432, parts.password)
        self.pool_size = pool_size

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{HOST}:{self.port}/{self.database}"

    def argv(self) -> list[str]:
        self._write_config()
        return [self.binary, str(self.workdir / "pgbouncer.ini")]

    def start(self) -> LocalPgBouncer:
        """Start it (as :data:`_RUN_AS` when this process is root) and wait until it
        answers. Not through PgBouncer's own ``user =``: the kernel forgets a process's
        parent-death signal when it changes user, and a PgBouncer that switched after
        exec outlived a killed test run; switched before exec, it dies with it."""
        if self.running():
            return self
        with open(self._log, "ab") as out:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=_as_server_user,
            )
        self._wait_ready()
        return self

    def ping(self, sock: socket.socket) -> bool:
        sock.sendall(_SSL_REQUEST)
        return sock.recv(1) in (b"N", b"S")

    def _write_config(self) -> None:
        host, port, password = self._server
        # Every database name goes to the server's database of that name, logging in as
        # the server URL's user (with its password, if it has one).
        target = f"host={host} port={port} user={self.user}"
        if password:
            target += f" password={password}"
        lines = [
            "[databases]",
            f"* = {target}",
            "[pgbouncer]",
            f"listen_addr = {HOST}",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.workdir / 'userlist.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 2000",
            f"pidfile = {self.workdir / 'pgbouncer.pid'}",
            # Drivers send these in the startup packet; PgBouncer refuses what it does
            # not know unless told to ignore it.
            "ignore_startup_parameters = extra_float_digits,options",
        ]
        runas = _run_as()
        (self.workdir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (self.workdir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        if runas is not None:
            for path in (self.workdir, *self.workdir.iterdir()):
                os.chown(path, runas[1], runas[2])


def _as_server_user() -> None:
    """A ``preexec_fn``: become :data:`_RUN_AS` when root, then die with the parent (after
    the switch, which clears the parent-death signal)."""
    runas = _run_as()
    if runas is not None:
        os.setgid(runas[2])
        os.setuid(runas[1])
    die_with_parent()


def _run_as() -> tuple[str, int, int] | None:
    """(name, uid, gid) PgBouncer runs as when this process is root, else None."""
    if os.getuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(_RUN_AS)
    except KeyError:
        entry = pwd.getpwnam("nobody")
    return entry.pw_name, entry.pw_uid, entry.pw_gid


def pgbouncer_skip_reason() -> str | None:
    """Why PgBouncer tests cannot run here, or None; decided without starting anything.
    Raises when ``QUICK_REQUIRE_POSTGRES`` is set and no ``pgbouncer`` is installed."""
    if find_binary("pgbouncer") is not None:
        return None
    if postgres_required():
        raise ServiceUnavailable("pgbouncer", f"QUICK_REQUIRE_POSTGRES is set but {NO_PGBOUNCER}")
    return NO_PGBOUNCER


@contextlib.contextmanager
def provide_pgbouncer_url(server_url: str | None = None) -> Iterator[str]:
    """The URL of a transaction-pooling PgBouncer in front of ``server_url`` (default: the
    session's PostgreSQL, :func:`shared_postgres_url`), stopped on exit."""
    if find_binary("pgbouncer") is None:
        raise ServiceUnavailable("pgbouncer", NO_PGBOUNCER)
    with LocalPgBouncer(server_url or shared_postgres_url()) as bouncer:
        assert isinstance(bouncer, LocalPgBouncer)
        yield bouncer.url

"""Private Redis and PostgreSQL servers on 127.0.0.1, always stopped on exit (and killed
with this process).

Both are context managers; a failure inside the ``with`` body still stops the server, and
``atexit`` plus a SIGTERM handler in ``__main__`` cover an interrupted run.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.common import log
from quickzones.testing.provision import RedisServer, die_with_parent, free_port

_STARTED: list[subprocess.Popen[bytes]] = []


def _stop_all() -> None:
    for p in _STARTED:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


atexit.register(_stop_all)


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server (no persistence, so fsync never enters a measurement): the
    test suites' own (quickzones.testing.provision), which also dies with this process."""
    with RedisServer() as server:
        log(f"redis on {server.url}")
        yield server.url


def _pg_bin(name: str) -> str:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: apt-get install -y postgresql")
    return found


@contextmanager
def postgres_server(settings: Sequence[str] = ()) -> Iterator[str]:
    """A private cluster in a temp dir, run as an unprivileged user when we are root
    (postgres refuses to run as root). fsync stays on: the defaults a deployment has.
    ``settings``: more ``name=value`` server settings (``-c``), e.g. a preloaded library."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="bench-pg-")
    data = os.path.join(tmp, "data")
    user = None
    if os.geteuid() == 0:
        user = "postgres" if _has_user("postgres") else "nobody"
        pw = pwd.getpwnam(user)
        os.chown(tmp, pw.pw_uid, pw.pw_gid)
    prefix = ["runuser", "-u", user, "--"] if user else []
    subprocess.run(
        [*prefix, _pg_bin("initdb"), "-D", data, "-U", "bench", "--auth=trust", "-E", "UTF8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(os.path.join(tmp, "pg.log"), "wb") as pglog:
        proc = subprocess.Popen(
            [
                *prefix,
                _pg_bin("postgres"),
                "-D",
                data,
                "-p",
                str(port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={tmp}",
                "-c",
                "max_connections=100",
                *(arg for setting in settings for arg in ("-c", setting)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=pglog,
            preexec_fn=die_with_parent,
        )
    _STARTED.append(proc)
    dsn = f"postgresql://bench@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        for _ in range(200):
            try:
                psycopg.connect(dsn).close()
                break
            except psycopg.OperationalError:
                time.sleep(0.1)
        log(f"postgres on port {port}")
        yield dsn
    finally:
        proc.terminate()  # SIGTERM: smart shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False

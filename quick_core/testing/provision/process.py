"""Server processes for tests: find a binary, start it so it dies with its parent, and
drive it (stop, kill, pause, restart on the same port).

Standard library only. A server started here is always cleaned up: by ``close()`` or the
context manager, at interpreter exit, and on Linux by the kernel if the process that
started it dies first (:func:`die_with_parent`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from quickzones.testing.provision import docker, ports
from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.ports import HOST, free_port

_live: weakref.WeakSet[Service] = weakref.WeakSet()


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


def die_with_parent() -> None:
    """A ``preexec_fn``: ask the kernel to SIGKILL the child when the process that started
    it dies, so a crashed or killed test run leaves no server (or ~1 GiB JVM) behind.
    Linux only; a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], *, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in ``workdir`` with its output appended to ``log``; it dies with us."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            preexec_fn=die_with_parent,
        )


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS-only server: its certificate and key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


class Service:
    """One server process on a fixed port; subclasses say how to run it (:meth:`argv`),
    how a client reaches it (:meth:`url_for`) and, for :func:`provide_server`, where else
    one may be found."""

    binary_name = ""  # the server binary
    service_name = ""  # what ServiceUnavailable calls it
    image = ""  # a Docker image of the server
    default_port = 0  # its usual port, in the container and on 127.0.0.1
    env_var = ""  # an environment variable that may name a running server's URL
    probe, expect = b"", b""  # a request, and how the first line of its answer starts

    def __init__(
        self,
        *,
        port: int | None = None,
        tls: TLSFiles | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        binary = find_binary(self.binary_name)
        if binary is None:
            raise ServiceUnavailable(
                self.service_name or self.binary_name,
                f"{self.binary_name} not found on PATH or in /usr/bin, /usr/sbin",
            )
        self.binary = binary
        self.port = port or free_port()
        self.tls = tls
        self.start_timeout = start_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix=f"quick-{self.binary_name}-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / "server.log"
        _live.add(self)

    # --- subclass hooks -------------------------------------------------------------

    def argv(self) -> list[str]:
        raise NotImplementedError

    @classmethod
    def url_for(cls, host: str, port: int, tls: TLSFiles | None = None) -> str:
        """The URL a client opens to reach such a server at ``host:port``."""
        raise NotImplementedError

    def ping(self, sock: socket.socket) -> bool:
        sock.sendall(self.probe)
        return read_line(sock).startswith(self.expect)

    @property
    def url(self) -> str:
        """The URL a client opens to reach this server."""
        return self.url_for(HOST, self.port, self.tls)

    # --- lifecycle ------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Service:
        """Start the server and wait until it answers; raise with its log if it won't."""
        if self.running():
            return self
        self._proc = spawn(self.argv(), workdir=self.workdir, log=self._log)
        self._wait_ready()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM and wait; SIGKILL if it lingers."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: an abrupt crash, nothing flushed."""
        self._signal_and_wait(signal.SIGKILL, 5.0)

    def restart(self, *, hard: bool = True) -> None:
        """Kill (or stop) and start again on the same port; in-memory data is lost."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung host)."""
        if self._proc is not None and self.running():
            stop_process(self._proc)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._proc is not None and self.running():
            self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Kill the server (if running) and remove its work directory."""
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
        _live.discard(self)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Service:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            # A paused process ignores SIGTERM until continued; SIGKILL works regardless.
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
        self._proc = None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise RuntimeError(
                    f"{self.binary_name} exited with {code} on port {self.port}:\n{self.log_tail()}"
                )
            try:
                with self._connect() as sock:
                    if self.ping(sock):
                        return
            except OSError:  # includes ssl.SSLError
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(
            f"{self.binary_name} did not answer on port {self.port} within "
            f"{self.start_timeout}s:\n{self.log_tail()}"
        )

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((HOST, self.port), timeout=0.5)
        sock.settimeout(0.5)
        if self.tls is None:
            return sock
        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
        return ctx.wrap_socket(sock, server_hostname=HOST)


def read_line(sock: socket.socket) -> bytes:
    """Bytes up to and including the first CRLF (or until the peer closes)."""
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
    return data


@contextlib.contextmanager
def provide_server(server: type[Service]) -> Iterator[str]:
    """A URL of a ``server``, tried in order: a container of its ``image`` (Docker), the
    URL its ``env_var`` names, a throwaway process on a free port, a server answering its
    ``probe`` on 127.0.0.1:``default_port``; else :class:`ServiceUnavailable` naming what
    was tried. What was started is gone on exit."""
    probe, expect, port = server.probe, server.expect, server.default_port
    if docker.docker_available():
        with docker.container(server.image, port) as (host, mapped):
            ports.wait_until_answers(host, mapped, probe, expect)
            yield server.url_for(host, mapped)
        return
    named = os.environ.get(server.env_var)
    if named:
        yield named
        return
    try:
        process = server()
    except ServiceUnavailable:
        pass
    else:
        with process:
            yield process.url
        return
    if ports.answers(HOST, port, probe, expect):
        yield server.url_for(HOST, port)
        return
    raise ServiceUnavailable(
        server.service_name or server.binary_name,
        f"no Docker engine (with testcontainers), no {server.env_var}, no "
        f"{server.binary_name} binary, and nothing answers on {HOST}:{port}",
    )


@atexit.register
def _close_all() -> None:
    for service in list(_live):
        service.close()


def terminate_all(procs: Iterable[subprocess.Popen[Any]], timeout: float = 60.0) -> None:
    """SIGTERM every process at once (so they shut down in parallel), wait for each up to
    ``timeout``, SIGKILL one that lingers."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` and wait (up to 2 s) until every thread of it is stopped: the
    signal is delivered asynchronously, and a request sent in the meantime could still
    be answered (a flaky "hung server" test)."""
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            states = [
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()
            ]
        except (OSError, IndexError):
            return  # no /proc here (or the process is gone): nothing more to wait for
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)

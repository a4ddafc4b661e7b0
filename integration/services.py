"""Real servers for integration tests: ``redis-server`` and ``memcached`` as subprocesses.

Each server listens on 127.0.0.1 on a free port, keeps no data on disk (a restart loses
everything, which the election tests rely on) and can be stopped, killed, paused and
restarted on the same port. Servers are always cleaned up: by ``close()``/the context
manager, at interpreter exit, and on Linux by the kernel if the test process dies first.

This module needs no Python driver; readiness is checked over a raw socket.
"""

from __future__ import annotations

import atexit
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from quick_core.testing import find_binary, free_port  # one copy, shipped with the plugin

HOST = "127.0.0.1"

_live: weakref.WeakSet[Service] = weakref.WeakSet()


class ServiceUnavailable(RuntimeError):
    """The server binary is not installed (the caller decides to skip or fail)."""

    def __init__(self, binary: str) -> None:
        super().__init__(f"{binary} not found on PATH or in /usr/bin, /usr/sbin")
        self.binary = binary


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL the server when
    # the test process dies, so a crashed or killed pytest leaves no server behind.
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS-only server: its certificate and key, and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


def make_tls_files(folder: Path) -> TLSFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 (needs ``cryptography``)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quick test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TLSFiles(folder / "server.pem", folder / "server.key", folder / "ca.pem")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return files


class Service:
    """One server process on a fixed port; subclasses say how to run and ping it."""

    binary_name = ""

    def __init__(
        self,
        *,
        port: int | None = None,
        tls: TLSFiles | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        binary = find_binary(self.binary_name)
        if binary is None:
            raise ServiceUnavailable(self.binary_name)
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

    def ping(self, sock: socket.socket) -> bool:
        raise NotImplementedError

    # --- lifecycle ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL an election opens to reach this server."""
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Service:
        """Start the server and wait until it answers; raise with its log if it won't."""
        if self.running():
            return self
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
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
            self._proc.send_signal(signal.SIGSTOP)

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
        return self.start()

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


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
    return data


class RedisServer(Service):
    """``redis-server`` with persistence off, so a restart starts empty."""

    binary_name = "redis-server"

    @property
    def url(self) -> str:
        if self.tls is None:
            return f"redis://{HOST}:{self.port}/0"
        return f"rediss://{HOST}:{self.port}/0?ssl_ca_certs={self.tls.ca}"

    def argv(self) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.cert),
                "--tls-key-file",
                str(self.tls.key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                "--tls-auth-clients",
                "no",
            ]
        return [
            self.binary,
            *listen,
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.workdir),
            "--loglevel", "warning",
        ]  # fmt: skip

    def ping(self, sock: socket.socket) -> bool:
        sock.sendall(b"PING\r\n")
        return _read_line(sock).startswith(b"+PONG")


class MemcachedServer(Service):
    """``memcached`` with a small cache and UDP off."""

    binary_name = "memcached"

    @property
    def url(self) -> str:
        if self.tls is None:
            return f"memcached://{HOST}:{self.port}"
        return f"memcached://{HOST}:{self.port}?tls_ca_certs={self.tls.ca}"

    def argv(self) -> list[str]:
        argv = [self.binary, "-l", HOST, "-p", str(self.port), "-U", "0", "-m", "16"]
        if self.tls is not None:
            argv += ["-Z", "-o", f"ssl_chain_cert={self.tls.cert},ssl_key={self.tls.key}"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root unless told to
        return argv

    def ping(self, sock: socket.socket) -> bool:
        sock.sendall(b"version\r\n")
        return _read_line(sock).startswith(b"VERSION")


SERVICES: dict[str, Callable[..., Service]] = {
    "redis": RedisServer,
    "memcached": MemcachedServer,
}


@atexit.register
def _close_all() -> None:
    for service in list(_live):
        service.close()

"""Ports and raw-socket probes: a free port on 127.0.0.1, and "does something answer"."""

from __future__ import annotations

import random
import socket
import time

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing uses right now, below the kernel's ephemeral
    range: a port from that range can meanwhile become the source port of any outgoing
    connection (a driver's, a client's), and a server then started on it is unreachable
    (the fault test's fdbserver failed so in CI, on ports 53717, 35103 and 46003)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 20000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        found: int = sock.getsockname()[1]
        return found


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(2048, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def answers(
    host: str, port: int, probe: bytes = b"", expect: bytes = b"", timeout: float = 0.5
) -> bool:
    """True when ``host:port`` accepts a connection and, given a ``probe``, its first line
    starts with ``expect``; with neither, a connection that opens is enough."""
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


def wait_until_answers(
    host: str, port: int, probe: bytes = b"", expect: bytes = b"", timeout: float = 30.0
) -> None:
    """Block until :func:`answers`; ``RuntimeError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not answers(host, port, probe, expect):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing answered on {host}:{port} within {timeout}s")
        time.sleep(0.1)

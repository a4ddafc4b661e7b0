"""A FoundationDB cluster for the integration tests, and why there may be none.

Where the cluster comes from, in order:

1. ``FDB_CLUSTER_FILE`` names the cluster file of a running cluster (a local fdbserver,
   CI's service container). The tests write only under ``conf/`` and random
   ``quick-it-*`` prefixes and clear them afterwards, but still: use a test cluster.
2. A reachable Docker engine: ``foundationdb/foundationdb:7.3.x`` is started with
   testcontainers (``FDB_DOCKER_IMAGE`` overrides the image), configured ``single memory``.
3. Neither: the test module skips with one line saying so.

libfdb_c is needed in every case (the container's server is reached through it); with
``FDB_CLUSTER_FILE`` set and no libfdb_c the tests fail loudly rather than skip.
"""

from __future__ import annotations

import ctypes.util
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quick_core.testing import docker_available

DEFAULT_IMAGE = "foundationdb/foundationdb:7.3.43"
NO_FDB = "no FoundationDB: set FDB_CLUSTER_FILE or run a Docker engine"


def libfdb_c_present() -> bool:
    return ctypes.util.find_library("fdb_c") is not None


def docker_engine_reachable() -> bool:
    return docker_available()


def skip_reason() -> str | None:
    """Why the FDB integration tests cannot run here, or None if they can."""
    if os.environ.get("FDB_CLUSTER_FILE"):
        return None  # the user asked for a cluster: problems must fail, not skip
    if not docker_engine_reachable():
        return NO_FDB
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        return (
            "no FoundationDB: Docker is up but testcontainers is not (pip install testcontainers)"
        )
    if not libfdb_c_present():
        return "no FoundationDB client: Docker is up but libfdb_c is missing (see docs/fdb.md)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _exec(container: Any, *command: str) -> tuple[int, str]:
    code, output = container.get_wrapped_container().exec_run(list(command))
    return int(code), output.decode(errors="replace")


@contextmanager
def docker_cluster(workdir: Path) -> Iterator[str]:
    """Start a one-process FDB 7.3 in Docker; yields the path of its cluster file."""
    from testcontainers.core.container import DockerContainer

    port = _free_port()
    image = os.environ.get("FDB_DOCKER_IMAGE", DEFAULT_IMAGE)
    # Host networking mode makes the server advertise 127.0.0.1:port; the port is mapped to
    # the same number on the host, so the address in the cluster file works from both sides.
    container = (
        DockerContainer(image)
        .with_env("FDB_NETWORKING_MODE", "host")
        .with_env("FDB_PORT", str(port))
        .with_bind_ports(port, port)
    )
    container.start()
    try:
        deadline = time.monotonic() + 120
        configured = False
        while time.monotonic() < deadline:
            if not configured:
                code, out = _exec(
                    container, "fdbcli", "--timeout", "10", "--exec", "configure new single memory"
                )
                # "Database created", or already configured by an earlier attempt.
                configured = code == 0 or "already exists" in out
            if configured:
                code, out = _exec(container, "fdbcli", "--timeout", "5", "--exec", "status minimal")
                if "The database is available" in out:
                    break
            time.sleep(1)
        else:
            raise RuntimeError(f"FoundationDB in {image} did not become available in 120 s")
        cluster_file = workdir / "fdb.cluster"
        cluster_file.write_text(f"docker:docker@127.0.0.1:{port}\n")
        yield str(cluster_file)
    finally:
        container.stop()


@contextmanager
def cluster_file(workdir: Path) -> Iterator[str]:
    """The cluster file to test against: ``FDB_CLUSTER_FILE``, else a Docker container."""
    from_env = os.environ.get("FDB_CLUSTER_FILE")
    if from_env:
        yield from_env
        return
    with docker_cluster(workdir) as path:
        yield path

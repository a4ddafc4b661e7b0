"""The Docker probe and containers (through ``testcontainers``), for every service.

Both drivers are imported here and only when called: importing this module loads neither.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any


def docker_available(timeout: float = 10.0) -> bool:
    """True when ``testcontainers`` is installed and a Docker engine answers: the
    ``docker`` CLI's ``docker info`` succeeds, or the Docker SDK's ping does."""
    if importlib.util.find_spec("testcontainers") is None:
        return False
    cli = shutil.which("docker")
    if cli is not None:
        try:
            done = subprocess.run([cli, "info"], capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        else:
            if done.returncode == 0:
                return True
    return _sdk_ping(min(timeout, 3.0))


def _sdk_ping(timeout: float) -> bool:
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure to reach the engine means: no Docker here
        return False


def new_container(image: str) -> Any:
    """A ``testcontainers`` ``DockerContainer`` for ``image``, not started yet."""
    from testcontainers.core.container import (  # type: ignore[import-untyped,unused-ignore]
        DockerContainer,
    )

    return DockerContainer(image)


@contextlib.contextmanager
def container(image: str, port: int, **env: str) -> Iterator[tuple[str, int]]:
    """Run ``image`` with ``port`` published and ``env`` set; yields the host and port
    it is reachable on from here; removes the container on exit."""
    made = new_container(image).with_exposed_ports(port)
    for key, value in env.items():
        made = made.with_env(key, value)
    with made as running:
        yield running.get_container_host_ip(), int(running.get_exposed_port(port))

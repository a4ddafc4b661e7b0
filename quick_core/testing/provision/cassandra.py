"""A CQL-ready Cassandra: where one listens (:class:`CassandraEndpoint`), the raw-socket
readiness probe, and :func:`provide_cassandra`.

Starting a node from local jars is the integration suite's job (``integration/
cassandra_local.py`` builds a config tree this package should not guess); it uses the
probe, the contact-point parser and the Docker check from here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from quickzones.errors import MissingDependency
from quickzones.testing.provision import docker
from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.ports import HOST

DOCKER_IMAGE = "cassandra:5.0"
CQL_PORT = 9042


@dataclass(frozen=True, slots=True)
class CassandraEndpoint:
    """Where a CQL-ready Cassandra listens."""

    hosts: tuple[str, ...]
    port: int

    def url(self, keyspace: str) -> str:
        """The ``cassandra://`` store URL for ``keyspace``."""
        return f"cassandra://{','.join(self.hosts)}:{self.port}/{keyspace}"

    def cluster(self, **options: Any) -> Any:
        """A cassandra-driver ``Cluster`` (``pip install 'quickzones[cassandra]'``)."""
        try:
            from cassandra.cluster import Cluster
        except ImportError as err:
            raise MissingDependency("cassandra-driver", "cassandra", str(err)) from err

        return Cluster(list(self.hosts), port=self.port, **options)


def parse_contact_points(spec: str, default_port: int = CQL_PORT) -> tuple[list[str], int]:
    """``"h1,h2:9142"`` -> (["h1", "h2"], 9142). The driver takes one port for all hosts,
    so the first explicit ``:port`` wins."""
    hosts: list[str] = []
    port: int | None = None
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port_s = item.rpartition(":")
        if sep and port_s.isdigit() and "]" not in port_s:
            hosts.append(host.strip("[]"))
            port = port if port is not None else int(port_s)
        else:
            hosts.append(item.strip("[]"))
    if not hosts:
        raise ValueError(f"no hosts in CASSANDRA_CONTACT_POINTS={spec!r}")
    return hosts, port if port is not None else default_port


# A CQL v4 OPTIONS frame; any SUPPORTED reply (opcode 0x06) means the native port is up.
_CQL_OPTIONS = bytes([0x04, 0, 0, 0, 0x05, 0, 0, 0, 0])


def cql_ready(host: str, port: int) -> bool:
    """True when ``host:port`` answers a CQL OPTIONS request (no driver needed)."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.settimeout(2.0)
            sock.sendall(_CQL_OPTIONS)
            header = sock.recv(9)
            return len(header) >= 5 and header[4] == 0x06
    except OSError:
        return False


@contextlib.contextmanager
def provide_cassandra(ready_timeout: float = 180.0) -> Iterator[CassandraEndpoint]:
    """A CQL-ready Cassandra: a ``cassandra:5.0`` container, the cluster
    ``QUICK_CASSANDRA_CONTACT_POINTS`` (``host1,host2[:port]``) names, or a node on
    127.0.0.1:9042; else :class:`ServiceUnavailable` naming what was tried."""
    if docker.docker_available():
        env = {"MAX_HEAP_SIZE": "512M", "HEAP_NEWSIZE": "128M"}
        with docker.container(DOCKER_IMAGE, CQL_PORT, **env) as (host, port):
            deadline = time.monotonic() + ready_timeout
            while not cql_ready(host, port):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Cassandra container did not become CQL-ready")
                time.sleep(1.0)
            yield CassandraEndpoint((host,), port)
        return
    points = os.environ.get("QUICK_CASSANDRA_CONTACT_POINTS") or os.environ.get(
        "CASSANDRA_CONTACT_POINTS"
    )
    if points:
        hosts, port = parse_contact_points(points)
        yield CassandraEndpoint(tuple(hosts), port)
        return
    if cql_ready(HOST, CQL_PORT):
        yield CassandraEndpoint((HOST,), CQL_PORT)
        return
    raise ServiceUnavailable(
        "cassandra",
        "no Docker engine (with testcontainers), no QUICK_CASSANDRA_CONTACT_POINTS, and no "
        "CQL server on 127.0.0.1:9042",
    )

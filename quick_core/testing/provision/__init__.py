"""Provisioning: real servers for tests (Redis, memcached, Cassandra, FoundationDB), from a
Docker container, an address in the environment, a local binary started on a free port, or
a server already listening; :class:`ServiceUnavailable` says what was tried when none works.

The one place outside the scheme registry where the core touches drivers, and only when a
function is called: importing this package loads no driver. The pytest plugin's service
fixtures (:mod:`quickzones.testing.pytest_plugin`) and the repository's ``integration/`` suites
both use it, so each piece exists once:

* :mod:`.ports`: ``free_port``, raw-socket probes;
* :mod:`.process`: ``find_binary``, ``die_with_parent``, :class:`Service` (a server process
  that can be stopped, killed, paused, restarted), ``provide_server``;
* :mod:`.docker`: the Docker probe and containers;
* :mod:`.redis`, :mod:`.memcached`, :mod:`.cassandra`, :mod:`.fdb`, :mod:`.postgres`: one
  per service;
* :mod:`.errors`: :class:`ServiceUnavailable`.
"""

from __future__ import annotations

from quickzones.testing.provision.cassandra import (
    CassandraEndpoint,
    cql_ready,
    parse_contact_points,
    provide_cassandra,
)
from quickzones.testing.provision.docker import docker_available
from quickzones.testing.provision.errors import ServiceUnavailable, in_ci
from quickzones.testing.provision.fdb import (
    NO_FDB,
    FDBDist,
    LocalFDB,
    fdb_binding_mismatch,
    fdb_required,
    fdb_skip_reason,
    fdb_source,
    find_fdb_dist,
    libfdb_c_available,
    provide_fdb_cluster_file,
    shared_fdb_cluster_file,
    use_fdb_library,
)
from quickzones.testing.provision.memcached import MemcachedServer, provide_memcached
from quickzones.testing.provision.ports import HOST, answers, free_port, wait_until_answers
from quickzones.testing.provision.postgres import (
    NO_POSTGRES,
    LocalPostgres,
    postgres_required,
    postgres_skip_reason,
    provide_postgres_url,
    shared_postgres_url,
)
from quickzones.testing.provision.process import (
    Service,
    TLSFiles,
    die_with_parent,
    find_binary,
    provide_server,
)
from quickzones.testing.provision.redis import RedisServer, provide_redis

SERVICES: dict[str, type[Service]] = {"redis": RedisServer, "memcached": MemcachedServer}
"""The server processes by service name (the election suites start one of each)."""

__all__ = [
    "HOST",
    "NO_FDB",
    "NO_POSTGRES",
    "SERVICES",
    "CassandraEndpoint",
    "FDBDist",
    "LocalFDB",
    "LocalPostgres",
    "MemcachedServer",
    "RedisServer",
    "Service",
    "ServiceUnavailable",
    "TLSFiles",
    "answers",
    "cql_ready",
    "die_with_parent",
    "docker_available",
    "fdb_binding_mismatch",
    "fdb_required",
    "fdb_skip_reason",
    "fdb_source",
    "find_binary",
    "find_fdb_dist",
    "free_port",
    "in_ci",
    "libfdb_c_available",
    "parse_contact_points",
    "postgres_required",
    "postgres_skip_reason",
    "provide_cassandra",
    "provide_fdb_cluster_file",
    "provide_memcached",
    "provide_postgres_url",
    "provide_redis",
    "provide_server",
    "shared_fdb_cluster_file",
    "shared_postgres_url",
    "use_fdb_library",
    "wait_until_answers",
]

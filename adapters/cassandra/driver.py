"""cassandra-driver glue: the lazy import, connecting from a URL, and error translation.

Nothing here runs at import time, so ``quickzones.adapters.cassandra`` imports without the
driver and only a connection attempt raises :class:`MissingDependency`.
"""

from __future__ import annotations

from typing import Any

from quickzones.adapters.cassandra.url import CassandraURL
from quickzones.errors import MissingDependency, StorageError


class CassandraError(StorageError):
    """Cassandra failed a request. ``outcome_unknown`` is set when a write may or may not
    have been applied (a timeout after the request was sent)."""

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message, retryable=True)
        self.outcome_unknown = outcome_unknown


def require_driver() -> Any:
    """The ``cassandra`` package, or MissingDependency naming the pip extra."""
    try:
        import cassandra
        import cassandra.cluster
        import cassandra.policies
        import cassandra.query
    except ImportError as err:
        raise MissingDependency("cassandra-driver", "cassandra", str(err)) from err
    return cassandra


def consistency_level(name: str) -> int:
    cassandra = require_driver()
    level: int = getattr(cassandra.ConsistencyLevel, name.upper())
    return level


def make_cluster(url: CassandraURL) -> Any:
    """An unconnected ``Cluster`` for ``url``: protocol v5, token-aware DC-aware routing,
    the URL's consistency levels and request timeout as the default execution profile."""
    cassandra = require_driver()  # its submodules imported there, guarded
    cluster_mod, policies = cassandra.cluster, cassandra.policies
    EXEC_PROFILE_DEFAULT, Cluster = cluster_mod.EXEC_PROFILE_DEFAULT, cluster_mod.Cluster
    ExecutionProfile = cluster_mod.ExecutionProfile
    DCAwareRoundRobinPolicy = policies.DCAwareRoundRobinPolicy
    ExponentialReconnectionPolicy = policies.ExponentialReconnectionPolicy
    TokenAwarePolicy = policies.TokenAwarePolicy

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=url.local_dc)),
        consistency_level=consistency_level(url.consistency),
        serial_consistency_level=consistency_level(url.serial_consistency),
        request_timeout=url.timeout_s,
    )
    try:
        return Cluster(
            url.hosts,
            port=url.port,
            protocol_version=url.protocol_version,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connect_timeout=url.connect_timeout_s,
            # Connecting reads the whole schema and the peers on the control connection; the
            # driver gives those reads 2 s, which a busy node (one making or dropping
            # keyspaces) misses, and the connect fails with OperationTimedOut. They are
            # requests: the URL's request timeout.
            control_connection_timeout=url.timeout_s,
            # The driver's default backoff grows to 10 minutes: after an outage, consumers
            # would sit idle long after the nodes are back. 10 s at most.
            reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
        )
    except cassandra.UnresolvableContactPoints as err:
        # The constructor resolves the contact points; none resolving is a bad address.
        raise CassandraError(
            f"cannot connect to Cassandra at {url.display}: no contact point resolves "
            f"({', '.join(url.hosts)})"
        ) from err


def connect(url: CassandraURL) -> tuple[Any, Any]:
    """(cluster, session) for ``url`` (see :func:`make_cluster`)."""
    cassandra = require_driver()
    cluster = make_cluster(url)
    try:
        session = cluster.connect()
    except (cassandra.cluster.NoHostAvailable, cassandra.DriverException) as err:
        cluster.shutdown()
        raise CassandraError(f"cannot connect to Cassandra at {url.display}: {err}") from err
    return cluster, session


def read_error(err: BaseException, what: str) -> CassandraError:
    """A failed read: nothing was changed, the caller may retry."""
    return CassandraError(f"Cassandra {what} failed: {type(err).__name__}: {err}")


def driver_errors() -> tuple[type[BaseException], ...]:
    """Exception types the driver raises for a failed request (not for a bad statement)."""
    cassandra = require_driver()
    NoHostAvailable = cassandra.cluster.NoHostAvailable

    return (
        cassandra.Timeout,
        cassandra.Unavailable,
        cassandra.CoordinationFailure,
        cassandra.OperationTimedOut,
        cassandra.DriverException,
        NoHostAvailable,
        ConnectionError,
        OSError,
    )


def definitely_not_applied(err: BaseException) -> bool:
    """Unavailable is raised before any replica is asked; NoHostAvailable before any host
    took the request. Everything else (timeouts, failures) leaves a write's outcome open."""
    cassandra = require_driver()
    NoHostAvailable = cassandra.cluster.NoHostAvailable

    return isinstance(err, cassandra.Unavailable | NoHostAvailable)

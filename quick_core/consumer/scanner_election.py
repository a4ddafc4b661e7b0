"""Which consumer is the in-order scanner of each top-level queue (paper section 4.2).

One consumer per cluster scans pointers in vesting order, so no vested pointer waits
forever (invariant 10); the others scan at random. Exactly one, across processes: the
in-order scanner is whoever holds the cluster's lease record in the cluster's own store
(:class:`~quickzones.consumer.store_election.StoreElection`), so no two consumers ever scan
in order at once, and no extra service is needed.

A configured election (Redis or memcached, the paper's deployment) keeps the store's lease
uncontended: only its holder takes the store's lease, the other candidates never touch
it. When the configured election cannot be reached, every candidate competes for the
store's lease directly (the holder keeps it: no gap), and says so once per outage; when it
is back, a store lease holder that does not win the configured lease gives the store's
back at its next refresh, so the configured holder takes it one refresh later (at most
``ttl_s / 3`` with no in-order scanner). A candidate cut off from the configured election
alone keeps the store's lease until it sees that election again: the queue still has
exactly one in-order scanner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from quickzones.clock import Clock
from quickzones.consumer.election import Election, Leadership
from quickzones.consumer.state import Cluster
from quickzones.consumer.store_election import StoreElection
from quickzones.errors import StorageError

log = logging.getLogger("quick.consumer")

_FAILURES = (StorageError, OSError)


def lease_name(cluster: str, route: str = "") -> str:
    """The election name of a cluster's in-order scanner lease; with ``route``
    (:func:`route_of`), that of the consumers routed alike."""
    return f"quick-scanner:{cluster}" + (f"|{route}" if route else "")


def route_of(apps: Iterable[str] | None, job_types: Iterable[str] | None) -> str:
    """The name of a routing (``ConsumerConfig.apps`` and ``job_types``), the same for
    every consumer routed alike; "" for a consumer that takes everything.

    Consumers routed alike elect an in-order scanner of their own: one of them holding
    the cluster's lease would leave the pointers it does not take without one (invariant
    10), and a fleet routed entirely would have none. So every set of zones a fleet serves
    has exactly one in-order scanner: the cluster's, held by a consumer that takes
    everything, and one per routing."""
    parts = []
    if apps is not None:
        parts.append("apps=" + ",".join(sorted(set(apps))))
    if job_types is not None:
        parts.append("types=" + ",".join(sorted(set(job_types))))
    return ";".join(parts)


class ScannerElection:
    """The in-order scanner leases one consumer holds, per cluster.

    ``stores`` maps each cluster to the election in its own store (the authority);
    ``configured`` is the Redis or memcached election in front of it, or None.
    ``emit("scanner_election", cluster=..., held=...)`` reports each cluster's state at
    every refresh (the ``quick_in_order_scanner`` gauge).
    """

    def __init__(
        self,
        stores: Mapping[str, Election],
        candidate: str,
        clock: Clock,
        *,
        configured: Election | None = None,
        forced: bool | None = None,
        ttl_s: float = 5.0,
        emit: Callable[..., Any] = lambda event, **fields: None,
        route: str = "",
    ) -> None:
        self.stores = dict(stores)
        self.route = route  # route_of(apps, job_types): whose lease this consumer seeks
        self.configured = configured
        self.candidate = candidate
        self.clock = clock
        # True/False: this consumer is (not) the in-order scanner, without an election.
        self.forced = forced
        self.ttl_s = ttl_s
        self.emit = emit
        self._leadership: dict[str, Leadership] = {}  # the store leases held
        self._gates: dict[str, Leadership] = {}  # the configured election's leases held
        self._configured_down = False  # the store's election has taken over
        self._store_down = False

    @classmethod
    def in_stores(
        cls,
        clusters: Mapping[str, Cluster],
        candidate: str,
        clock: Clock,
        configured: Election | None,
        forced: bool | None,
        ttl_s: float,
        emit: Callable[..., Any],
        route: str = "",
    ) -> ScannerElection:
        """The election of a consumer of ``clusters``: each cluster's lease in its own
        store, read through that store's clock."""
        stores = {
            name: StoreElection(c.toplevel.kv, c.toplevel.keys, c.toplevel.clock)
            for name, c in clusters.items()
        }
        return cls(
            stores,
            candidate,
            clock,
            configured=configured,
            forced=forced,
            ttl_s=ttl_s,
            emit=emit,
            route=route,
        )

    def holds(self, cluster: str) -> bool:
        """Whether this consumer is the in-order scanner of ``cluster`` now: a local
        check of its store lease's expiry, made before every in-order scan, so a holder
        paused past its lease (SIGSTOP, a long GC) stops scanning in order as it wakes."""
        if self.forced is not None:
            return self.forced
        lease = self._leadership.get(cluster)
        return lease is not None and lease.expires_at > self.clock.now()

    def refresh(self, clusters: Iterable[str]) -> None:
        """Acquire, renew or give up each cluster's lease (every ``ttl_s / 3``)."""
        if self.forced is not None:
            return
        for cluster in clusters:
            change = self._hold_store_lease(cluster, may_hold=self._passes_gate(cluster))
            # The gauge first, then the log line that announces the change: whoever reads
            # the line and then the gauge (an operator, a test) sees them agree.
            self.emit("scanner_election", cluster=cluster, held=self.holds(cluster))
            if change is not None:
                log.info(*change)

    def release_all(self) -> None:
        """Give up every lease (shutdown): the next in-order scanner need not wait out the
        TTL. Best effort: an unreachable election lets the leases expire."""
        if self.configured is not None:
            for lease in self._gates.values():
                _release(self.configured, lease)
        for cluster, lease in self._leadership.items():
            _release(self.stores[cluster], lease)
        self._gates.clear()
        self._leadership.clear()

    # --- internals ------------------------------------------------------------------

    def _passes_gate(self, cluster: str) -> bool:
        """Whether this consumer may hold the store's lease of ``cluster``: always without
        a configured election or while it is unreachable (the store's election takes
        over), else only as the configured lease's holder."""
        configured = self.configured
        if configured is None:
            return True
        try:
            lease = self._gates.get(cluster)
            if lease is not None:
                lease = configured.renew(lease, self.ttl_s)
            if lease is None:
                name = lease_name(cluster, self.route)
                lease = configured.try_acquire(name, self.candidate, self.ttl_s)
        except _FAILURES as err:
            self._gates.pop(cluster, None)
            if not self._configured_down:
                log.warning(
                    "scanner election unreachable, the store's election takes over: %s", err
                )
                self._configured_down = True
            return True
        if self._configured_down:
            log.warning("scanner election reachable again, the store's election hands back")
            self._configured_down = False
        if lease is None:
            self._gates.pop(cluster, None)
            return False
        self._gates[cluster] = lease
        return True

    def _hold_store_lease(
        self, cluster: str, *, may_hold: bool
    ) -> tuple[str, ...] | None:
        """Take, keep or give up the store's lease of ``cluster``; the log line (format
        and arguments) announcing a change of holder, for :meth:`refresh` to write once
        the gauge says the same."""
        store = self.stores[cluster]
        lease = self._leadership.get(cluster)
        lost = ("consumer %s lost the in-order scanner lease", self.candidate)
        try:
            if not may_hold:
                if lease is not None:
                    del self._leadership[cluster]
                    _release(store, lease)  # best effort: unreleased, it lapses
                    return lost
                return None
            change: tuple[str, ...] | None = None
            if lease is not None:
                lease = store.renew(lease, self.ttl_s)
                if lease is None:
                    change = lost
            if lease is None:
                name = lease_name(cluster, self.route)
                lease = store.try_acquire(name, self.candidate, self.ttl_s)
                if lease is not None:
                    change = (
                        "consumer %s is the in-order scanner of %s%s (term %s)",
                        self.candidate,
                        cluster,
                        f" for {self.route}" if self.route else "",
                        str(lease.term),
                    )
        except _FAILURES as err:
            # Unknown whether the lease is still ours: stop scanning in order; it lapses.
            change = lost if self._leadership.pop(cluster, None) is not None else None
            if not self._store_down:
                log.warning("store election unreachable, scanning in random mode: %s", err)
                self._store_down = True
            return change
        if self._store_down:
            log.warning("store election reachable again")
            self._store_down = False
        if lease is None:
            self._leadership.pop(cluster, None)
        else:
            self._leadership[cluster] = lease
        return change


def _release(election: Election, lease: Leadership) -> None:
    try:
        election.release(lease)
    except _FAILURES:
        pass

"""Which consumer is the in-order scanner of each top-level queue (paper section 4.2).

One consumer per cluster scans pointers in vesting order, so no vested pointer waits
forever; the others scan at random. The choice is a lease from an :class:`Election`
(Redis, memcached, or in-process), renewed while held. When the election cannot be
reached, every consumer scans at random and says so once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from quickzones.clock import Clock
from quickzones.consumer.election import Election, Leadership
from quickzones.errors import StorageError

log = logging.getLogger("quick.consumer")


class ScannerElection:
    """The in-order scanner leases one consumer holds, per cluster."""

    def __init__(
        self,
        election: Election,
        candidate: str,
        clock: Clock,
        *,
        forced: bool | None = None,
        ttl_s: float = 5.0,
    ) -> None:
        self.election = election
        self.candidate = candidate
        self.clock = clock
        # True/False: this consumer is (not) the in-order scanner, without an election.
        self.forced = forced
        self.ttl_s = ttl_s
        self._leadership: dict[str, Leadership] = {}
        self._broken = False

    def holds(self, cluster: str) -> bool:
        if self.forced is not None:
            return self.forced
        lease = self._leadership.get(cluster)
        return lease is not None and lease.expires_at > self.clock.now()

    def refresh(self, clusters: Iterable[str]) -> None:
        """Acquire or renew the lease of each cluster's top-level queue; on election
        failure, give every lease up (scan at random) and log it once."""
        if self.forced is not None:
            return
        try:
            for cluster in clusters:
                lease = self._leadership.get(cluster)
                if lease is not None:
                    lease = self.election.renew(lease, self.ttl_s)
                    if lease is None:
                        log.info("consumer %s lost the in-order scanner lease", self.candidate)
                if lease is None:
                    lease = self.election.try_acquire(
                        f"quick-scanner:{cluster}", self.candidate, self.ttl_s
                    )
                    if lease is not None:
                        log.info(
                            "consumer %s is the in-order scanner of %s (term %d)",
                            self.candidate,
                            cluster,
                            lease.term,
                        )
                if lease is None:
                    self._leadership.pop(cluster, None)
                else:
                    self._leadership[cluster] = lease
            if self._broken:
                log.warning("scanner election reachable again")
                self._broken = False
        except (StorageError, OSError) as err:
            self._leadership.clear()
            if not self._broken:
                log.warning("scanner election unreachable, scanning in random mode: %s", err)
                self._broken = True

    def release_all(self) -> None:
        """Give up every lease (shutdown): the next in-order scanner need not wait out the
        TTL. Best effort: an unreachable election lets the leases expire."""
        for lease in self._leadership.values():
            try:
                self.election.release(lease)
            except (StorageError, OSError):
                pass
        self._leadership.clear()

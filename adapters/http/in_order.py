"""``quick serve`` as a candidate for the in-order (sequential) scanner (paper section 4.2).

A fleet of remote pull workers (``quick worker --remote``) has no local consumer: the
server scans and visits zones on their behalf (:mod:`.pull`). Without a candidate of its
own, such a fleet had no in-order scanner at all, and nothing kept a vested pointer from
waiting forever (invariant 10). :class:`ServeInOrder` puts the server into the same
election as every local consumer of its cluster (the lease record in the store,
:class:`~quickzones.consumer.scanner_election.ScannerElection`), so a fleet of local
consumers, servers and remote workers has exactly one in-order scanner; while this server
holds the lease, its pull leases take the oldest vested pointers first.

A server answers many workers' leases, and scans that all took the oldest pointers first
would have them contend for the same pointer leases (what random choice avoids, issue 27
point 2). So the holder scans in order at most once every ``every_s`` (one sequential
scanner's pace), its other scans at random: the oldest vested pointer is still leased
within ``every_s`` of a pull, and concurrent pulls still spread over the zones.

The server stands only while remote workers are pulling through it (a lease scan within
``active_s``): a server nobody pulls from scans nothing, and holding the lease would keep
the role from a consumer that scans.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.election import new_candidate_id
from quickzones.consumer.scanner_election import ScannerElection
from quickzones.consumer.state import Cluster

if TYPE_CHECKING:
    from quickzones.client import Quick

log = logging.getLogger("quick.serve")

# The holder's in-order scans are at least this far apart (see the module's text).
IN_ORDER_EVERY_S = 1.0


class ServeInOrder:
    """The server's candidacy for its cluster's in-order scanner lease.

    ``config.in_order`` True/False forces the role (no election), as for a consumer;
    ``config.election_ttl_s`` is the lease's TTL. :meth:`scan_in_order` is what the pull
    leaser asks once before each scan, :meth:`holds` what its heartbeat reports;
    :meth:`run_until` keeps the lease on a thread."""

    def __init__(
        self,
        q: Quick,
        config: ConsumerConfig,
        *,
        name: str | None = None,
        active_s: float | None = None,
        every_s: float = IN_ORDER_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = q.toplevel.cluster
        self.name = name or f"serve-{new_candidate_id()}"
        self.election = ScannerElection.in_stores(
            {self.cluster: Cluster(zones=q.items, toplevel=q.toplevel, kv=q.kv)},
            self.name,
            q.clock,
            None,
            config.in_order,
            config.election_ttl_s,
            lambda event, **fields: None,
        )
        self.ttl_s = config.election_ttl_s
        # A worker busy with long handlers does not pull; a few TTLs bridge that.
        self.active_s = active_s if active_s is not None else 3 * self.ttl_s
        self.clock = clock
        self.forced = config.in_order
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last_in_order: float | None = None
        self._last_scan: float | None = None
        self._wake = threading.Event()

    def holds(self) -> bool:
        """Whether the server is its cluster's in-order scanner now (what its heartbeat
        reports). A question only: it takes no scan's turn (a heartbeat that took it
        made the next pull's scan a random one, seen as items out of order in CI)."""
        if self.forced is not None:
            return self.forced
        return self.election.holds(self.cluster)

    def scan_in_order(self) -> bool:
        """Whether this pull scan is in order, asked once per scan: the server holds the
        lease and made no in-order scan in the last ``every_s`` (this one is then it).
        Notes that workers pull (the first scan after a quiet spell wakes the election
        thread, so the server stands at once)."""
        if self.forced is not None:
            return self.forced
        now = self.clock()
        with self._lock:
            idle = not self._active(now)
            self._last_scan = now
            if idle:
                self._wake.set()
            if not self.election.holds(self.cluster):
                return False
            if self._last_in_order is not None and now - self._last_in_order < self.every_s:
                return False
            self._last_in_order = now
            return True

    def refresh(self) -> None:
        """Stand (take or renew the lease) while workers pull, else stand down."""
        if self._last_scan is not None and self._active(self.clock()):
            self.election.refresh([self.cluster])
        else:
            self.election.release_all()

    def run_until(self, stopping: threading.Event) -> None:
        """Refresh every ``ttl_s / 3`` (or when woken) until ``stopping``; then give the
        lease back, so the next in-order scanner need not wait out its TTL."""
        try:
            while not stopping.is_set():
                self._wake.clear()
                try:
                    self.refresh()
                except Exception:  # never let the server lose its election thread
                    log.exception("in-order scanner election")
                self._wake.wait(self.ttl_s / 3)
        finally:
            self.election.release_all()

    def stop(self) -> None:
        """Wake :meth:`run_until` (its ``stopping`` set first) so it returns now."""
        self._wake.set()

    def _active(self, now: float) -> bool:
        return self._last_scan is not None and now - self._last_scan <= self.active_s

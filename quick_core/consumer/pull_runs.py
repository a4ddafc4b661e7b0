"""The items ``quick serve``'s pull leases hold for remote workers (issue 45 point 4), so
its heartbeat record lists them as a consumer's lists what it runs, and each run's end
is counted in its job type's run times and failures as a local worker's is.

A remote worker's run is seen from the server: it starts when the item is leased and
ends when its outcome arrives (the settler's ``ended`` hook); a lease that lapsed
unsettled (a remote worker that vanished) is dropped uncounted. In memory only, bounded
by the leases outstanding: an item costs a dictionary entry, never a write of its own.
"""

from __future__ import annotations

import threading

from quickzones.clock import Clock, now_ms
from quickzones.consumer.pickups import PickupCounts
from quickzones.consumer.settler import FAILED, UNRUN
from quickzones.store.heartbeats import RunningItem
from quickzones.store.records import WorkItem, ZoneId


class PullRuns:
    """The pull leases outstanding, by (zone, item id)."""

    def __init__(self, clock: Clock, counts: PickupCounts, cluster: str) -> None:
        self._clock = clock
        self._counts = counts
        self._cluster = cluster
        self._lock = threading.Lock()
        self._held: dict[tuple[ZoneId, str], RunningItem] = {}

    def leased(self, zone: ZoneId, item: WorkItem, at_ms: int) -> None:
        run = RunningItem(zone, item.item_id, item.job_type, item.attempts, at_ms, item.vesting_ms)
        with self._lock:
            self._held[(zone, item.item_id)] = run

    def extended(self, zone: ZoneId, item_id: str, until_ms: int) -> None:
        with self._lock:
            run = self._held.get((zone, item_id))
            if run is not None:
                self._held[(zone, item_id)] = RunningItem(
                    zone, item_id, run.job_type, run.attempts, run.since_ms, until_ms
                )

    def ended(self, zone: ZoneId, item_id: str, how: str) -> None:
        """Its remote worker's outcome arrived (``how``: the settler's RAN, FAILED or
        UNRUN): a run is counted unless it never ran."""
        with self._lock:
            run = self._held.pop((zone, item_id), None)
        if run is None or how == UNRUN:
            return
        now = now_ms(self._clock)
        self._counts.ran(
            zone=zone, job_type=run.job_type, seconds=max(0, now - run.since_ms) / 1000,
            ok=how != FAILED, cluster=self._cluster, at_ms=now,
        )  # fmt: skip

    def running(self) -> list[RunningItem]:
        """The leases outstanding; those lapsed are forgotten."""
        now = now_ms(self._clock)
        with self._lock:
            for key in [k for k, r in self._held.items() if r.lapsed(now)]:
                del self._held[key]
            return list(self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

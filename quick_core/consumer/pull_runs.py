"""The items ``quick serve``'s pull leases hold for remote workers (issue 45 point 4), and
the server's heartbeat that lists them as a consumer's lists what it runs; each run's end
is counted in its job type's run times and failures as a local worker's is.

A remote worker's run is seen from the server: it starts when the item is leased and
ends when its outcome arrives (the settler's ``ended`` hook), or when its remote worker
hears it went (``/v1/leases/cancelled``); a lease that lapsed unsettled (a remote worker
that vanished) is dropped uncounted. In memory only, bounded by the leases outstanding:
an item costs a dictionary entry, never a write of its own. The server's record is
written only while its leases hold items, so a server no remote worker polls is not
shown as a consumer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.maintenance import Heartbeats
from quickzones.consumer.pickups import PickupCounts
from quickzones.consumer.settler import FAILED, UNRUN
from quickzones.store.heartbeats import RunningItem
from quickzones.store.records import WorkItem, ZoneId

if TYPE_CHECKING:
    from quickzones.client import Quick


class PullRuns:
    """The pull leases outstanding, by (zone, item id)."""

    def __init__(
        self,
        q: Quick,
        name: str,
        config: ConsumerConfig,
        leads: Callable[[], bool],  # whether it holds the in-order scanner lease
        heartbeat_s: float,
        counts: PickupCounts,
    ) -> None:
        self._clock = q.clock
        self._counts = counts
        self._cluster = q.toplevel.cluster
        self._lock = threading.Lock()
        self._held: dict[tuple[ZoneId, str], RunningItem] = {}
        self.heartbeats = Heartbeats(
            lambda: [(self._cluster, q.kv, q.keys)], name, config, self._busy,
            lambda _: leads(), q.clock, heartbeat_s, running=self.running, counts=counts,
            workers=0, idle_record=False,
        )  # fmt: skip

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

    def _busy(self) -> tuple[int, int]:  # (running, held) as its record shows them
        with self._lock:
            return len(self._held), len(self._held)

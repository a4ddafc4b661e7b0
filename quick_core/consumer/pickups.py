"""A consumer's pickup counts between flushes (issue 31 point 6): each dequeue adds one
to its (app, tenant, minute, bucket) counter in memory; :meth:`PickupCounts.take` hands
the gathered counts to the heartbeat loop, which adds them to the store
(:mod:`quickzones.store.pickups`) in one transaction of atomic adds. An item costs a
dictionary increment under a lock, never a write of its own."""

from __future__ import annotations

import threading
from collections import Counter

from quickzones.store.pickups import bucket_of, minute_of
from quickzones.store.records import ZoneId

# Distinct counters kept between two flushes before new ones are dropped: a bound on
# memory should the store be unreachable for long (counts are a summary; losing some
# loses nothing stored).
MAX_KEYS = 100_000


class PickupCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[tuple[str, str, int, int]]] = {}

    def dequeued(
        self, *, zone: ZoneId, enqueued_ms: int, pickup_ms: int, cluster: str, **_: object
    ) -> None:
        """One item dequeued (the manager's ``dequeued`` event's fields)."""
        key = (zone.app, zone.tenant, minute_of(pickup_ms), bucket_of(pickup_ms - enqueued_ms))
        with self._lock:
            counts = self._counts.setdefault(cluster, Counter())
            if key in counts or len(counts) < MAX_KEYS:
                counts[key] += 1

    def take(self) -> dict[str, Counter[tuple[str, str, int, int]]]:
        """The counts gathered since the last take, by cluster; starts over."""
        with self._lock:
            taken, self._counts = self._counts, {}
        return taken

    def give_back(self, cluster: str, counts: Counter[tuple[str, str, int, int]]) -> None:
        """Counts a flush could not write: added to the next one."""
        with self._lock:
            self._counts.setdefault(cluster, Counter()).update(counts)

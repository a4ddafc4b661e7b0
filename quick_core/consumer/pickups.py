"""A consumer's pickup counts between flushes (issue 31 point 6): each dequeue adds one
to its (app, tenant, minute, bucket) counter in memory; :meth:`PickupCounts.flush`, on the
heartbeat loop (or ``quick serve``'s, for the items its pull consumers lease), adds them
to the store (:mod:`quickzones.store.pickups`) in one transaction of atomic adds. An item costs a
dictionary increment under a lock, never a write of its own."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable

from quickzones.errors import StorageError
from quickzones.store import pickups
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore
from quickzones.store.pickups import bucket_of, minute_of
from quickzones.store.records import ZoneId

log = logging.getLogger("quick.consumer")

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

    def flush(self, stores: Iterable[tuple[str, KVStore, KeySpace]], now_ms: int) -> None:
        """Add the counts gathered since the last flush to each cluster's store; what a
        store refused is kept for the next flush."""
        with self._lock:
            taken, self._counts = self._counts, {}
        for cluster, kv, keys in stores:
            mine = taken.pop(cluster, None)
            if not mine:
                continue
            try:
                pickups.add_counts(kv, keys, mine, now_ms)
            except StorageError as err:
                with self._lock:
                    self._counts.setdefault(cluster, Counter()).update(mine)
                log.warning("writing pickup counts failed: %s", err)

"""A consumer's pickup counts between flushes (issue 31 point 6): each dequeue adds one
to its (app, tenant, minute, bucket) counter in memory; :meth:`PickupCounts.flush`, on the
heartbeat loop (or ``quick serve``'s, for the items its pull consumers lease), adds them
to the store (:mod:`quickzones.store.pickups`) in one transaction of atomic adds. An item costs a
dictionary increment under a lock, never a write of its own."""

from __future__ import annotations

import logging
import threading
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
        # (cluster, app, tenant, minute, bucket) -> count: one flat dict, the cheapest
        # increment (a few microseconds a dequeue on a loaded machine).
        self._counts: dict[tuple[str, str, str, int, int], int] = {}

    def dequeued(
        self, *, zone: ZoneId, enqueued_ms: int, pickup_ms: int, cluster: str, **_: object
    ) -> None:
        """One item dequeued (the manager's ``dequeued`` event's fields)."""
        wait_ms = pickup_ms - enqueued_ms
        key = (cluster, zone.app, zone.tenant, minute_of(pickup_ms), bucket_of(wait_ms))
        with self._lock:
            n = self._counts.get(key)
            if n is not None or len(self._counts) < MAX_KEYS:
                self._counts[key] = (n or 0) + 1

    def flush(self, stores: Iterable[tuple[str, KVStore, KeySpace]], now_ms: int) -> None:
        """Add the counts gathered since the last flush to each cluster's store; what a
        store refused is kept for the next flush."""
        with self._lock:
            taken, self._counts = self._counts, {}
        by_cluster: dict[str, dict[tuple[str, str, int, int], int]] = {}
        for (cluster, app, tenant, minute, bucket), n in taken.items():
            by_cluster.setdefault(cluster, {})[(app, tenant, minute, bucket)] = n
        for cluster, kv, keys in stores:
            mine = by_cluster.get(cluster)
            if not mine:
                continue
            try:
                pickups.add_counts(kv, keys, mine, now_ms)
            except StorageError as err:
                with self._lock:
                    for (app, tenant, minute, bucket), n in mine.items():
                        key = (cluster, app, tenant, minute, bucket)
                        self._counts[key] = self._counts.get(key, 0) + n
                log.warning("writing pickup counts failed: %s", err)

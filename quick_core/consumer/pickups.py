"""A consumer's pickup counts between flushes (issue 31 point 6): each dequeue adds one
to its (app, tenant, minute, bucket) counter in memory, its wait counted from when the
item vested (:func:`waited_ms`); :meth:`PickupCounts.flush`, on the
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


def waited_ms(enqueued_ms: int, pickup_ms: int, vested_ms: int | None = None) -> int:
    """How long an item picked up at ``pickup_ms`` waited: from when it vested (its
    requested run time, the end of a retry's backoff; ``WorkItem.vested_ms``), or from
    its enqueue where that is not known. A delay or a backoff is asked for, not waited
    (issue 41 point 10: reminders started on time showed 2.5 s of pickup); an item taken
    ahead of its vesting time (a timer's look-ahead) waited nothing."""
    since = enqueued_ms if vested_ms is None else max(enqueued_ms, vested_ms)
    return max(0, pickup_ms - since)


class PickupCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (cluster, app, tenant, minute, bucket) -> count: one flat dict, the cheapest
        # increment (a few microseconds a dequeue on a loaded machine).
        self._counts: dict[tuple[str, str, str, int, int], int] = {}

    def dequeued(
        self,
        *,
        zone: ZoneId,
        enqueued_ms: int,
        pickup_ms: int,
        cluster: str,
        vested_ms: int | None = None,
        **_: object,
    ) -> None:
        """One item dequeued (the manager's ``dequeued`` event's fields): its wait is
        counted from when it vested (:func:`waited_ms`)."""
        wait_ms = waited_ms(enqueued_ms, pickup_ms, vested_ms)
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

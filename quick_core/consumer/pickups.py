"""A consumer's pickup counts between flushes (issue 31 point 6): each dequeue adds one
to its (app, tenant, minute, bucket) counter in memory, its wait counted from when the
item vested (:func:`waited_ms`); and, counted the same way, each run that ended its
(app, job type, window, bucket) run-time counter and, when it failed, its (app, minute,
job type) failure counter (issue 45 point 4). :meth:`PickupCounts.flush`, on the
heartbeat loop (or ``quick serve``'s, for the items its pull consumers lease), adds them
to the store (:mod:`quickzones.store.pickups`, :mod:`quickzones.store.run_figures`) in
transactions of atomic adds of a bounded size, each added once however often it is
tried. An item costs dictionary increments under a lock, never a write of its own."""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from quickzones.errors import StorageError
from quickzones.store import pickups, run_figures
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


@dataclass(slots=True)
class _Flush:
    """One flush transaction's counts of one cluster: tried again as it was (same id, same
    time) until it commits, so a try whose answer was lost is not added twice."""

    cluster: str
    flush_id: str
    now_ms: int
    counts: dict[tuple[str, str, int, int], int]
    runs: dict[tuple[str, str, int, int], int]
    failures: dict[tuple[str, int, str], int]

    @property
    def size(self) -> int:
        return len(self.counts) + len(self.runs) + len(self.failures)


class PickupCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (cluster, app, tenant, minute, bucket) -> count: one flat dict, the cheapest
        # increment (a few microseconds a dequeue on a loaded machine).
        self._counts: dict[tuple[str, str, str, int, int], int] = {}
        # (cluster, app, job_type, window, bucket) -> runs, and (cluster, app, minute,
        # job_type) -> failed runs: the run figures, gathered alike.
        self._runs: dict[tuple[str, str, str, int, int], int] = {}
        self._failures: dict[tuple[str, str, int, str], int] = {}
        # Flushes whose transaction failed, oldest first, and their counters in all.
        self._failed: list[_Flush] = []
        self._failed_keys = 0
        self._flush_ids = (f"{uuid.uuid4().hex[:16]}.{n}" for n in itertools.count())

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
            if n is not None or self._room():
                self._counts[key] = (n or 0) + 1

    def ran(
        self,
        *,
        zone: ZoneId,
        job_type: str,
        seconds: float,
        ok: bool,
        cluster: str,
        at_ms: int,
        **_: object,
    ) -> None:
        """One run that ended at ``at_ms`` after ``seconds`` (a worker's ``ran`` event's
        fields, or a pull lease's outcome), failed unless ``ok``."""
        run_key = (
            cluster, zone.app, job_type, run_figures.window_of(at_ms),
            bucket_of(int(seconds * 1000)),
        )  # fmt: skip
        with self._lock:
            n = self._runs.get(run_key)
            if n is not None or self._room():
                self._runs[run_key] = (n or 0) + 1
            if not ok:
                fail_key = (cluster, zone.app, minute_of(at_ms), job_type)
                n = self._failures.get(fail_key)
                if n is not None or self._room():
                    self._failures[fail_key] = (n or 0) + 1

    def _room(self) -> bool:
        """Whether a new counter may be kept (under the lock)."""
        kept = len(self._counts) + len(self._runs) + len(self._failures)
        return kept + self._failed_keys < MAX_KEYS

    def flush(self, stores: Iterable[tuple[str, KVStore, KeySpace]], now_ms: int) -> None:
        """Add the counts gathered since the last flush to each cluster's store, in
        transactions of at most :data:`~quickzones.store.pickups.FLUSH_BATCH` counters,
        after those that failed before (tried again as they were, so none is added twice:
        issue 41 point 14d). A cluster whose store refuses one is left until the next
        flush; failed counts older than the hour kept are dropped (their minutes are)."""
        with self._lock:
            taken, self._counts = self._counts, {}
            runs, self._runs = self._runs, {}
            failures, self._failures = self._failures, {}
            todo, self._failed, self._failed_keys = self._failed, [], 0
        # Each cluster's counters of the three series, in one list cut into batches.
        by_cluster: dict[str, list[tuple[int, Any, int]]] = {}
        gathered_all: tuple[dict[Any, int], ...] = (taken, runs, failures)
        for kind, gathered in enumerate(gathered_all):
            for key, n in gathered.items():  # (cluster, *the series' key)
                by_cluster.setdefault(key[0], []).append((kind, key[1:], n))
        for cluster, rows in by_cluster.items():
            for at in range(0, len(rows), pickups.FLUSH_BATCH):
                batch = _Flush(cluster, next(self._flush_ids), now_ms, {}, {}, {})
                series: tuple[dict[Any, int], ...] = (batch.counts, batch.runs, batch.failures)
                for kind, key, n in rows[at : at + pickups.FLUSH_BATCH]:
                    series[kind][key] = n
                todo.append(batch)
        targets = {cluster: (kv, keys) for cluster, kv, keys in stores}
        failed: list[_Flush] = []
        refused: set[str] = set()
        for batch in todo:
            target = targets.get(batch.cluster)
            if target is None or now_ms - batch.now_ms > pickups.KEEP_MINUTES * 60_000:
                continue  # a cluster not flushed here, or counts of minutes cleared since
            if batch.cluster in refused:
                failed.append(batch)  # its store refused one already: not now
                continue
            try:
                pickups.add_counts(
                    *target, batch.counts, batch.now_ms, batch.flush_id,
                    runs=batch.runs, failures=batch.failures,
                )  # fmt: skip
            except StorageError as err:
                failed.append(batch)
                refused.add(batch.cluster)
                log.warning("writing pickup counts failed (tried again later): %s", err)
        with self._lock:
            self._failed = failed + self._failed
            self._failed_keys = sum(b.size for b in self._failed)

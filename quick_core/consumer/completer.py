"""The completer: how a Worker's (Algorithm 3) finished items are completed in their zone.

A completion deletes the item if this consumer still holds its lease (invariant 4), and
keeps the handler's result when its job type asks. One interface, two implementations:

* :class:`InlineCompleter` completes each item in its own transaction at once (a test or
  the simulator calling :meth:`~quickzones.consumer.Consumer.execute` directly);
* :class:`BatchedCompleter` collects finished items and completes them per zone, one
  transaction per zone and flush: on a flusher thread when the consumer runs threaded,
  after each visit in :meth:`~quickzones.consumer.Consumer.run_until_idle`.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from quickzones.consumer.state import Cluster, Work
from quickzones.errors import StorageError
from quickzones.store.records import ZoneId

log = logging.getLogger("quick.consumer")


class Completer(Protocol):
    """Completes the items whose handler succeeded."""

    def complete(self, work: Work) -> None:
        """Complete ``work`` now or at the next :meth:`flush`."""

    def flush(self) -> int:
        """Complete every item handed over and not completed yet; returns how many."""


# Completions merged into one transaction at most (a bound on its size and on what one
# conflict makes retry).
MERGE_MAX = 1000


def complete_batch(
    clusters: dict[str, Cluster], works: Sequence[Work], emit: Callable[..., Any]
) -> None:
    """Complete ``works``: per cluster, the zones' items in one transaction (up to
    ``MERGE_MAX`` items) when the zone store can (``complete_zones``), else one
    ``complete_many`` per zone."""
    by_zone: dict[tuple[str, ZoneId], list[Work]] = defaultdict(list)
    for work in works:
        by_zone[(work.cluster, work.zone)].append(work)
    by_cluster: dict[str, list[tuple[ZoneId, list[Work]]]] = defaultdict(list)
    for (cluster, zone), group in by_zone.items():
        by_cluster[cluster].append((zone, group))
    for cluster, groups in by_cluster.items():
        zones = clusters[cluster].zones
        merge = getattr(zones, "complete_zones", None)
        if merge is None:  # e.g. items in Cassandra: one batch per zone
            one = _per_zone(zones)
            for zone, group in groups:
                _complete_groups(one, [(zone, group)], emit)
            continue
        chunk: list[tuple[ZoneId, list[Work]]] = []
        size = 0
        for zone, group in groups:
            if chunk and size + len(group) > MERGE_MAX:
                _complete_groups(merge, chunk, emit)
                chunk, size = [], 0
            chunk.append((zone, group))
            size += len(group)
        if chunk:
            _complete_groups(merge, chunk, emit)


def _per_zone(zones: Any) -> Callable[[list[Any]], list[list[Exception | None]]]:
    def complete(args: list[Any]) -> list[list[Exception | None]]:
        [(zone, leased, results)] = args
        return [zones.complete_many(zone, leased, results=results)]

    return complete


def _complete_groups(
    complete: Callable[[list[Any]], list[list[Exception | None]]],
    groups: list[tuple[ZoneId, list[Work]]],
    emit: Callable[..., Any],
) -> None:
    """One completing transaction for ``groups``; emits each item's outcome."""
    args = []
    for zone, group in groups:
        results = {w.item.item_id: w.result for w in group if w.result is not None}
        leased = [(w.item.item_id, w.item.lease_id or "") for w in group]
        args.append((zone, leased, results or None))
    try:
        outcomes = complete(args)
    except StorageError as err:
        for zone, _ in groups:
            emit("complete_error", zone=zone, error=str(err))
        return
    for (zone, group), zone_outcomes in zip(groups, outcomes, strict=True):
        for w, outcome in zip(group, zone_outcomes, strict=True):
            if outcome is None:
                emit("completed", zone=zone, item_id=w.item.item_id, job_type=w.item.job_type)
            else:
                emit("lease_lost", zone=zone, item_id=w.item.item_id, where="complete")


class InlineCompleter:
    """Completes each item as it is handed over."""

    def __init__(self, clusters: dict[str, Cluster], emit: Callable[..., Any]) -> None:
        self.clusters = clusters
        self.emit = emit

    def complete(self, work: Work) -> None:
        complete_batch(self.clusters, [work], self.emit)

    def flush(self) -> int:
        return 0  # nothing is ever pending


class BatchedCompleter:
    """Collects finished items; :meth:`flush` completes them, batched per zone.

    A finished item is appended to a list under a lock; only the first of a batch (the
    list was empty) wakes the flusher, so a batch costs one wake-up, not one per item."""

    def __init__(self, clusters: dict[str, Cluster], emit: Callable[..., Any]) -> None:
        self.clusters = clusters
        self.emit = emit
        self._lock = threading.Lock()
        self._pending: list[Work] = []
        self._ready = threading.Event()  # set when the list turned non-empty

    def complete(self, work: Work) -> None:
        with self._lock:
            self._pending.append(work)
            first = len(self._pending) == 1
        if first:
            self._ready.set()

    def flush(self) -> int:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            complete_batch(self.clusters, batch, self.emit)
            self.emit("completions_flushed", items=len(batch))
        return len(batch)

    def run(self, stopping: threading.Event, pace_s: float = 0.0) -> None:
        """The flusher thread: flush whenever something is pending, until ``stopping``;
        after each flush, wait ``pace_s`` (``completion_flush_s``) or until ``stopping``."""
        while not stopping.is_set():
            # Cleared before the flush takes the list: an item added after the take sets
            # it again. The timeout also covers a flush that raised with items pending.
            if not self._ready.wait(0.05) and not self._pending:
                continue
            self._ready.clear()
            try:
                self.flush()
            except Exception:
                log.exception("completion flush failed")
            if pace_s > 0:
                stopping.wait(pace_s)


BatchCompleter = BatchedCompleter

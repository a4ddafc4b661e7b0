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
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from quickzones.consumer.state import Cluster, Work
from quickzones.errors import StorageError
from quickzones.records import ZoneId

log = logging.getLogger("quick.consumer")


class Completer(Protocol):
    """Completes the items whose handler succeeded."""

    def complete(self, work: Work) -> None:
        """Complete ``work`` now or at the next :meth:`flush`."""

    def flush(self) -> int:
        """Complete every item handed over and not completed yet; returns how many."""


def complete_batch(
    clusters: dict[str, Cluster], works: Sequence[Work], emit: Callable[..., Any]
) -> None:
    """Complete ``works`` with one ``complete_many`` per (cluster, zone)."""
    by_zone: dict[tuple[str, ZoneId], list[Work]] = defaultdict(list)
    for work in works:
        by_zone[(work.cluster, work.zone)].append(work)
    for (cluster, zone), group in by_zone.items():
        try:
            results = {w.item.item_id: w.result for w in group if w.result is not None}
            outcomes = clusters[cluster].zones.complete_many(
                zone,
                [(w.item.item_id, w.item.lease_id or "") for w in group],
                results=results or None,
            )
        except StorageError as err:
            emit("complete_error", zone=zone, error=str(err))
            continue
        for w, outcome in zip(group, outcomes, strict=True):
            if outcome is None:
                emit("completed", zone=zone, item_id=w.item.item_id)
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
    """Collects finished items; :meth:`flush` completes them, batched per zone."""

    def __init__(self, clusters: dict[str, Cluster], emit: Callable[..., Any]) -> None:
        self.clusters = clusters
        self.emit = emit
        self._pending: queue.Queue[Work] = queue.Queue()

    def complete(self, work: Work) -> None:
        self._pending.put(work)

    def flush(self) -> int:
        batch: list[Work] = []
        while True:
            try:
                batch.append(self._pending.get_nowait())
            except queue.Empty:
                break
        if batch:
            complete_batch(self.clusters, batch, self.emit)
        return len(batch)

    def run(self, stopping: threading.Event) -> None:
        """The flusher thread: flush whenever something is pending, until ``stopping``."""
        while not stopping.is_set():
            try:
                first = self._pending.get(timeout=0.05)
            except queue.Empty:
                continue
            self._pending.put(first)
            try:
                self.flush()
            except Exception:
                log.exception("completion flush failed")


BatchCompleter = BatchedCompleter

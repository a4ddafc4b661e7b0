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

from quickzones.consumer import settler
from quickzones.consumer.settler import Completion, NotCommitted, Settler
from quickzones.consumer.state import Cluster, Work
from quickzones.store.records import ZoneId

log = logging.getLogger("quick.consumer")


class Completer(Protocol):
    """Completes the items whose handler succeeded."""

    def complete(self, work: Work) -> None:
        """Complete ``work`` now or at the next :meth:`flush`."""

    def flush(self) -> int:
        """Complete every item handed over and not completed yet; returns how many."""


RETRY_S = 0.05  # after a flush whose commit failed or raised, the next try
# The flusher's wait with nothing pending: complete() and wake() end it; the timeout only
# bounds a stop whose wake() was missed.
IDLE_WAIT_S = 1.0

# Completions merged into one transaction at most (the settler's bound; a test sets it).
MERGE_MAX = settler.MERGE_MAX


def complete_batch(
    clusters: dict[str, Cluster], works: Sequence[Work], emit: Callable[..., Any]
) -> list[Work]:
    """Complete ``works`` through the one settler (:meth:`Settler.complete_many`: per
    cluster, the zones' items in one transaction where the zone store can); emits each
    item's outcome, and a failed transaction once per zone. Returns the works whose
    transaction failed with a retryable error: still leased, for the caller to try again."""
    by_cluster: dict[str, list[Work]] = defaultdict(list)
    for work in works:
        by_cluster[work.cluster].append(work)
    settle = Settler(clusters)
    again: list[Work] = []
    for cluster, group in by_cluster.items():
        completions = [
            Completion(w.zone, w.item.item_id, w.item.lease_id or "", w.result) for w in group
        ]
        outcomes = settle.complete_many(cluster, completions, merge_max=MERGE_MAX)
        failed: set[ZoneId] = set()
        for w, outcome in zip(group, outcomes, strict=True):
            zone = w.zone
            if outcome is None:
                emit("completed", zone=zone, item_id=w.item.item_id, job_type=w.item.job_type)
            elif isinstance(outcome, NotCommitted):
                retry = outcome.cause.retryable
                if retry:
                    again.append(w)
                if zone not in failed:
                    failed.add(zone)
                    emit("complete_error", zone=zone, error=str(outcome), retry=retry)
            else:
                emit("lease_lost", zone=zone, item_id=w.item.item_id, where="complete")
    return again


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
        """Commit what is pending; returns how many items were committed or settled. A
        batch whose commit failed with a retryable error, or raised, goes back on the list
        (ahead of what finished since) for the next flush: the items are still leased, and
        left alone they would wait for their leases to lapse and run again, each charged
        an attempt."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return 0
        again = batch  # until the commit returns
        try:
            again = complete_batch(self.clusters, batch, self.emit)
        finally:
            if again:
                self._put_back(again)
        self.emit("completions_flushed", items=len(batch) - len(again))
        return len(batch) - len(again)

    def _put_back(self, works: list[Work]) -> None:
        with self._lock:
            self._pending[:0] = works

    def wake(self) -> None:
        """End the flusher's wait (a stop): it flushes what is pending and looks at
        ``stopping``."""
        self._ready.set()

    def run(self, stopping: threading.Event, pace_s: float = 0.0) -> None:
        """The flusher thread: flush whenever something is pending, until ``stopping``
        (and a :meth:`wake`); after each flush, wait ``pace_s`` (``completion_flush_s``) or
        until ``stopping``."""
        while not stopping.is_set():
            # Cleared before the flush takes the list: an item added after the take sets
            # it again. The short timeout covers a flush that put its batch back (its
            # commit failed) or left items pending; with none, the thread sleeps until
            # one is (an idle worker costs nothing).
            timeout = RETRY_S if self._pending else IDLE_WAIT_S
            if not self._ready.wait(timeout) and not self._pending:
                continue
            self._ready.clear()
            try:
                self.flush()
            except Exception:
                log.exception("completion flush failed")
            if pace_s > 0:
                stopping.wait(pace_s)


BatchCompleter = BatchedCompleter

"""The settler: what becomes of a leased item once its run ended (paper Algorithm 3's
outcomes; issue 40 point 7), applied in one place.

The outcomes are complete (one item, or many in one commit per zone or per cluster),
retry (requeue with the job type's backoff, or dead-letter when permanent or out of
attempts: :func:`retry_decision`), nack (requeue without an error), give back (release an
item that never ran) and dead letter. Two forms apply them:

* the store form, :class:`Settler`: the zone store's operations, the zone's pointer pulled
  earlier to match a requeued item, and the waiting scans told. A local consumer's workers
  reach it through :class:`~quickzones.consumer.failure.Failures` and
  :mod:`~quickzones.consumer.completer`; ``quick serve``'s routes
  (:mod:`quickzones.adapters.http.api`) call it for a remote worker's outcomes, its
  ``ended`` hook giving back the slots the item held (``held_slots``);
* the HTTP form, a remote worker's :class:`~quickzones.adapters.http.worker.RemoteItemOps`:
  the same outcomes sent to those routes, with the same :func:`retry_decision`.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quickzones.consumer.state import Cluster
from quickzones.errors import StorageError
from quickzones.registry import JobType, RetryPolicy
from quickzones.store.records import WorkItem, ZoneId

# Completions merged into one transaction at most (a bound on its size and on what one
# conflict makes retry).
MERGE_MAX = 1000

# How an outcome ended an item's lease, told to the ``ended`` hook: its run ended (a
# completion, or a nack: it ran), its run failed (a retry or a dead letter), or it was
# given back without running.
RAN, FAILED, UNRUN = "ran", "failed", "unrun"


def retry_decision(
    job: JobType | None,
    error_count: int,
    enqueued_ms: int,
    now_s: float,
    rng: random.Random,
    *,
    permanent: bool,
) -> float | None:
    """A failed run's outcome, by its job type's :class:`~quickzones.registry.RetryPolicy`
    (the default one for a type no handler declares): None to dead-letter it (permanent,
    or out of attempts or time), else the delay in seconds before it runs again.
    ``error_count`` is the item's before this failure."""
    policy = job.retry if job is not None else RetryPolicy()
    errors = error_count + 1
    if permanent or policy.gives_up(errors, now_s - enqueued_ms / 1000):
        return None
    return policy.backoff_s(errors, rng)


class NotCommitted(StorageError):
    """A completion's outcome when its transaction failed (``cause``): unknown whether it
    completed; nothing else in the batch is stopped by it."""

    def __init__(self, cause: StorageError) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Completion:
    """One leased item to complete, with its handler's return value (None: none kept)."""

    zone: ZoneId
    item_id: str
    lease_id: str
    result: Any = None


class Settler:
    """The store form of the outcomes, over one or more clusters' zone stores."""

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        *,
        requeued: Callable[[], None] = lambda: None,
        ended: Callable[[ZoneId, str, str], None] = lambda zone, item_id, how: None,
    ) -> None:
        self.clusters = clusters
        # Told after each item requeued or given back to its zone: the waiting scans look
        # again (their own commits wake no commit watcher).
        self.requeued = requeued
        # Told after each outcome that ended an item's lease, and how (:data:`RAN`...):
        # the server gives back the slots a remote worker's item held, and counts its run.
        self.ended = ended

    def complete(
        self, cluster: str, zone: ZoneId, item_id: str, lease_id: str, result: Any = None
    ) -> None:
        """Complete one item (``LeaseLost``, ``ItemNotFound`` when not its holder's)."""
        self.clusters[cluster].zones.complete(zone, item_id, lease_id, result=result)
        self.ended(zone, item_id, RAN)

    def complete_many(
        self, cluster: str, completions: Sequence[Completion], *, merge_max: int = MERGE_MAX
    ) -> list[Exception | None]:
        """Complete ``completions`` of one cluster, one outcome each in their order: the
        zones' items in one transaction (up to ``merge_max`` items) where the zone store
        can (``complete_zones``), else one ``complete_many`` per zone. A transaction that
        failed gives each of its items :class:`NotCommitted`; nothing else is stopped by
        it."""
        by_zone: dict[ZoneId, list[int]] = defaultdict(list)
        for n, c in enumerate(completions):
            by_zone[c.zone].append(n)
        outcomes: list[Exception | None] = [None] * len(completions)
        zones = self.clusters[cluster].zones
        merge = getattr(zones, "complete_zones", None)
        groups = list(by_zone.items())
        chunks: list[list[tuple[ZoneId, list[int]]]] = []
        if merge is None:  # e.g. items in Cassandra: one batch per zone
            chunks = [[group] for group in groups]
        else:
            size = 0
            for group in groups:
                if chunks and chunks[-1] and size + len(group[1]) <= merge_max:
                    chunks[-1].append(group)
                    size += len(group[1])
                else:
                    chunks.append([group])
                    size = len(group[1])
        for chunk in chunks:
            args: list[tuple[ZoneId, list[tuple[str, str]], dict[str, Any] | None]] = []
            for zone, indexes in chunk:
                leased = [(completions[n].item_id, completions[n].lease_id) for n in indexes]
                kept = {
                    completions[n].item_id: completions[n].result
                    for n in indexes
                    if completions[n].result is not None
                }
                args.append((zone, leased, kept or None))
            try:
                if merge is None:
                    [(one, items, results)] = args
                    done = [zones.complete_many(one, items, results=results)]
                else:
                    done = merge(args)
            except StorageError as err:
                failed = NotCommitted(err)
                for _, indexes in chunk:
                    for n in indexes:
                        outcomes[n] = failed
                continue
            for (zone, indexes), zone_outcomes in zip(chunk, done, strict=True):
                for n, outcome in zip(indexes, zone_outcomes, strict=True):
                    outcomes[n] = outcome
                    if outcome is None:
                        self.ended(zone, completions[n].item_id, RAN)
        return outcomes

    def requeue(
        self,
        cluster: str,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        delay_ms: int,
        *,
        error: str | None = None,
        count_error: bool = True,
        ran: bool = True,
        meta: dict[str, object] | None = None,
        not_before_ms: int | None = None,
    ) -> WorkItem:
        """Retry, nack or give back: release the lease, the item vesting again after
        ``delay_ms``; its zone's pointer, requeued at the lease's end, is pulled earlier to
        match, and the waiting scans told."""
        c = self.clusters[cluster]
        item = c.zones.requeue(
            zone,
            item_id,
            lease_id,
            delay_ms,
            error=error,
            count_error=count_error,
            ran=ran,
            meta=meta,
            not_before_ms=not_before_ms,
        )
        self.ended(zone, item_id, (FAILED if count_error else RAN) if ran else UNRUN)
        c.toplevel.pull_pointer_earlier(zone, item.vesting_ms)
        self.requeued()
        return item

    def dead_letter(
        self,
        cluster: str,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        traceback: str | None = None,
        *,
        ran: bool = True,
    ) -> None:
        """Move the item to the dead letters (only its lease holder's, with a lease id);
        ``ran``: its run failed (else it never ran: one that could not be delivered)."""
        self.clusters[cluster].zones.dead_letter(
            zone, item_id, lease_id, reason, traceback=traceback
        )
        self.ended(zone, item_id, FAILED if ran else UNRUN)

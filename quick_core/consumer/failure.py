"""What a Worker (Algorithm 3) does with an item that did not complete, through the one
settler (:mod:`quickzones.consumer.settler`, which ``quick serve``'s routes apply too).

A failure is retried with its job type's backoff (the item is requeued with a later
vesting time and the zone's pointer is pulled earlier to match), or dead-lettered when
permanent or out of attempts; a ``Nack`` requeues without counting an error; an item
given back (shutdown, throttling) is released at once. An at-most-once item whose handler
started is gone already: it is only reported.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from quickzones.clock import Clock
from quickzones.consumer.settler import Settler, retry_decision
from quickzones.consumer.state import Cluster, Work
from quickzones.errors import ItemNotFound, LeaseLost, Nack, QuickError, StorageError
from quickzones.handler_meta import handler_keys
from quickzones.registry import JobType
from quickzones.store import outcomes

log = logging.getLogger(__name__)


class Failures:
    """Requeues, dead-letters, nacks and gives back items for a consumer's workers."""

    def __init__(
        self,
        clusters: dict[str, Cluster],
        clock: Clock,
        rng: random.Random,
        emit: Callable[..., Any],
        requeued: Callable[[], None] = lambda: None,
    ) -> None:
        self.clusters = clusters
        self.clock = clock
        self.rng = rng
        self.emit = emit
        # Told after each item given back to its zone: the consumer's scanner rescans and
        # so knows the item's new vesting time (its own commits wake no commit watcher).
        self.requeued = requeued
        self.settler = Settler(clusters, requeued=lambda: self.requeued())

    def _retry_meta(self, work: Work) -> dict[str, object] | None:
        """The failed run's ``retry_meta`` for its retry, quick's own keys left out: the
        run has ended, so a bad key can only be said, not refused."""
        kept, problems = handler_keys(work.retry_meta)
        for problem in problems:
            log.warning(
                "item %s (%s): retry_meta %s; left out",
                work.item.item_id,
                work.item.job_type,
                problem,
            )
        return kept or None

    def fail(
        self,
        work: Work,
        job: JobType | None,
        reason: str,
        *,
        permanent: bool,
        failure: str | None = None,
    ) -> str:
        """Requeue with backoff, or dead-letter; ``failure`` is the handler's bounded
        traceback (:func:`quickzones.consumer.failure_log.format_failure`), kept with a dead
        letter."""
        zone, item = work.zone, work.item
        if work.started:
            self._taken_failed(work, reason)
            self.emit(
                "failed",
                zone=zone,
                item_id=item.item_id,
                job_type=item.job_type,
                reason=reason,
                redelivered=False,
            )
            return "failed"
        delay = retry_decision(
            job, item.error_count, item.enqueued_ms, self.clock.now(), self.rng, permanent=permanent
        )
        try:
            if delay is None:
                self.settler.dead_letter(
                    work.cluster, zone, item.item_id, item.lease_id, reason, traceback=failure
                )
                self.emit(
                    "dead_lettered",
                    zone=zone,
                    item_id=item.item_id,
                    job_type=item.job_type,
                    reason=reason,
                )
                return "dead_lettered"
            self.settler.requeue(
                work.cluster,
                zone,
                item.item_id,
                item.lease_id or "",
                int(delay * 1000),
                error=reason,
                meta=self._retry_meta(work),
            )
            self.emit(
                "requeued", zone=zone, item_id=item.item_id, job_type=item.job_type, delay_s=delay
            )
            return "requeued"
        except (LeaseLost, ItemNotFound):
            self.emit("lease_lost", zone=zone, item_id=item.item_id, where="fail")
            return "lease_lost"
        except StorageError as err:
            # The lease expires and the item runs again: at-least-once holds.
            self.emit("requeue_error", zone=zone, item_id=item.item_id, error=str(err))
            return "lease_lost"

    def _taken_failed(self, work: Work, reason: str) -> None:
        """An at-most-once item whose run failed was deleted as it started: its outcome
        record (types that keep one) says failed, with the error counted, never
        completed (issue 28, point 10)."""
        item = work.item
        failed = item.with_(error_count=item.error_count + 1, last_error=reason)
        try:
            self.clusters[work.cluster].zones.record_outcome(
                work.zone, failed, outcomes.FAILED, reason=reason
            )
        except StorageError as err:
            self.emit("complete_error", zone=work.zone, error=str(err))

    def nack(self, work: Work, nack: Nack) -> str:
        zone, item = work.zone, work.item
        if work.started:
            self._taken_failed(work, "nack")
            self.emit(
                "failed",
                zone=zone,
                item_id=item.item_id,
                job_type=item.job_type,
                reason="nack",
                redelivered=False,
            )
            return "failed"
        try:
            self.settler.requeue(
                work.cluster,
                zone,
                item.item_id,
                item.lease_id or "",
                int(max(0.0, nack.delay_s) * 1000),
                count_error=False,
                meta=nack.meta,
            )
        except (LeaseLost, ItemNotFound):
            self.emit("lease_lost", zone=zone, item_id=item.item_id, where="nack")
            return "lease_lost"
        except StorageError as err:
            self.emit("requeue_error", zone=zone, item_id=item.item_id, error=str(err))
            return "lease_lost"
        self.emit(
            "nacked", zone=zone, item_id=item.item_id, job_type=item.job_type, delay_s=nack.delay_s
        )
        return "nacked"

    def give_back(self, work: Work, delay_ms: int = 0) -> str:
        """Release a lease without counting an error (shutdown, throttling)."""
        if work.started:  # an at-most-once item whose handler started: it is gone
            self.emit(
                "failed",
                zone=work.zone,
                item_id=work.item.item_id,
                job_type=work.item.job_type,
                reason="interrupted",
                redelivered=False,
            )
            return "failed"
        try:
            self.settler.requeue(
                work.cluster,
                work.zone,
                work.item.item_id,
                work.item.lease_id or "",
                delay_ms,
                count_error=False,
                ran=False,  # never started: the lease's count is taken back
                # Leased ahead of its vesting time: back as it was, not due before then.
                not_before_ms=work.due_ms,
            )
        except (QuickError, OSError):
            pass  # the lease expires on its own
        self.emit("released", zone=work.zone, item_id=work.item.item_id)
        return "released"


def describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text[:500]

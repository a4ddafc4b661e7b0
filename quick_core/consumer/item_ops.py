"""What a Worker (paper Algorithm 3) does to the item it holds, wherever the item lives.

Algorithm 3 is written once (:class:`~quickzones.consumer.worker.Worker`); the operations
it needs on its item are this seam: the check just before a handler starts, the lease's
extension, the completion, and what becomes of an item that did not complete (retry with
backoff, dead letter, nack, give back). :class:`StoreItemOps` implements it over the zone
store (a consumer of the store); a remote worker of ``quick serve`` implements it over the
HTTP API (:mod:`quickzones.adapters.http.worker`), so the same rules hold on both paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from quickzones.consumer.completer import Completer
from quickzones.consumer.failure import Failures
from quickzones.consumer.state import Cluster, Work
from quickzones.errors import Nack
from quickzones.registry import JobType
from quickzones.store import outcomes
from quickzones.store.flow_key_lapses import HoldsRuns
from quickzones.store.progress import ProgressStore
from quickzones.store.records import WorkItem


class ItemOps(Protocol):
    """A held item's operations, as a Worker and the lease extender use them."""

    def start(self, work: Work) -> WorkItem:
        """The check just before the handler of an item that waited starts: raises
        ``ItemNotFound`` (completed or cancelled meanwhile) or ``LeaseLost`` (another holds
        it), so such an item never starts. ``StorageError``: unknown."""
        ...

    def take_at_most_once(self, work: Work) -> Exception | None:
        """Delete an at-most-once item as its handler starts (holding its lease); the
        failure (``LeaseLost``...) or None. ``StorageError``: unknown."""
        ...

    def extend(self, work: Work, lease_ms: int) -> WorkItem:
        """Renew the lease (``LeaseLost``/``ItemNotFound`` if it is gone); for a taken
        at-most-once item (``work.started``), its run's hold on its one-at-a-time key
        (``LeaseLost`` when that lapsed and the key passed on)."""
        ...

    def gone_many(self, works: Sequence[Work]) -> list[bool]:
        """Which of these running items were cancelled meanwhile, in one call for all
        (one request for a remote worker). ``StorageError``: unknown."""
        ...

    def complete(self, work: Work) -> None:
        """Hand a success to the completer."""
        ...

    def finish_taken(self, work: Work) -> None:
        """An at-most-once item (deleted as it started) ran to success: its outcome
        record, if its type keeps one, says completed and keeps ``work.result``."""
        ...

    def fail(
        self,
        work: Work,
        job: JobType | None,
        reason: str,
        *,
        permanent: bool,
        failure: str | None = None,
    ) -> str:
        """Requeue with backoff (an error counted) or dead-letter; returns the outcome."""
        ...

    def nack(self, work: Work, nack: Nack) -> str:
        """Requeue after ``nack.delay_s``, no error counted; returns the outcome."""
        ...

    def give_back(self, work: Work, delay_ms: int = 0) -> str:
        """Release the lease unstarted, nothing counted; returns the outcome."""
        ...

    def progress(self, work: Work, fraction: float, note: str | None, tr: Any = None) -> None:
        """Keep the handler's progress with the item (``tr``: a transactional handler's
        transaction); a store that keeps none ignores it."""
        ...


class StoreItemOps:
    """:class:`ItemOps` over the zone stores of a consumer's clusters."""

    def __init__(
        self,
        clusters: dict[str, Cluster],
        failures: Failures,
        completer: Callable[[], Completer],
    ) -> None:
        self.clusters = clusters
        self.failures = failures
        self.completer = completer  # which completer takes a success now

    def start(self, work: Work) -> WorkItem:
        item = work.item
        zones = self.clusters[work.cluster].zones
        return zones.start(work.zone, item.item_id, item.lease_id or "")

    def take_at_most_once(self, work: Work) -> Exception | None:
        zones = self.clusters[work.cluster].zones
        [outcome] = zones.complete_many(work.zone, [(work.item.item_id, work.item.lease_id or "")])
        return outcome

    def extend(self, work: Work, lease_ms: int) -> WorkItem:
        item = work.item
        zones = self.clusters[work.cluster].zones
        if work.started:
            # Taken (at most once): no item left to lease; its run's hold on its
            # one-at-a-time key is what lapses if this process dies.
            if not isinstance(zones, HoldsRuns):
                return item
            return item.with_(vesting_ms=zones.extend_key_hold(work.zone, item, lease_ms))
        return zones.extend_lease(work.zone, item.item_id, item.lease_id or "", lease_ms)

    def gone_many(self, works: Sequence[Work]) -> list[bool]:
        return [
            self.clusters[w.cluster].zones.get(w.zone, w.item.item_id) is None for w in works
        ]

    def complete(self, work: Work) -> None:
        self.completer().complete(work)

    def finish_taken(self, work: Work) -> None:
        zones = self.clusters[work.cluster].zones
        zones.record_outcome(work.zone, work.item, outcomes.COMPLETED, result=work.result)

    def fail(
        self,
        work: Work,
        job: JobType | None,
        reason: str,
        *,
        permanent: bool,
        failure: str | None = None,
    ) -> str:
        return self.failures.fail(work, job, reason, permanent=permanent, failure=failure)

    def nack(self, work: Work, nack: Nack) -> str:
        return self.failures.nack(work, nack)

    def give_back(self, work: Work, delay_ms: int = 0) -> str:
        return self.failures.give_back(work, delay_ms)

    def progress(self, work: Work, fraction: float, note: str | None, tr: Any = None) -> None:
        zones = self.clusters[work.cluster].zones
        if isinstance(zones, ProgressStore):
            item = work.item
            inside = {} if tr is None else {"tr": tr}
            zones.record_progress(
                work.zone, item.item_id, item.lease_id or "", fraction, note, **inside
            )

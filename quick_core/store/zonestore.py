"""The zone store seam: what consumers need from wherever work items live.

Two implementations: :class:`quickzones.store.zones.KVZoneStore` (items in the same KV store as
the pointers, every operation a KV transaction) and
``quickzones.adapters.cassandra.CassandraZoneStore`` (items in Cassandra,
paper section 6.1). Consumers see only this protocol and the top-level queue, never a
backend.

Failure kinds are distinguishable: :class:`~quickzones.errors.ItemNotFound` (completed,
cancelled or never there), :class:`~quickzones.errors.LeaseLost` (someone else holds it),
:class:`~quickzones.errors.ItemNotVested` (not available to lease yet).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quickzones.store.flow_keys import FlowKey
from quickzones.store.kv import KVTransaction
from quickzones.store.records import WorkItem, ZoneId


@dataclass(frozen=True, slots=True)
class NewItem:
    """What a producer hands to enqueue; the zone store fills in times and the id."""

    job_type: str
    payload: bytes
    # Fractions kept: the zone store rounds now + delay up to a whole millisecond once,
    # so the item never vests before the time asked for and at most 1 ms after it.
    delay_ms: float = 0
    priority: int = 0
    item_id: str | None = None
    content_type: str = "bytes"
    ttl_ms: int | None = None
    delivery: str = "at_least_once"
    meta: dict[str, Any] = field(default_factory=dict)
    # Order by commit versionstamp among this priority's other FIFO items (KV zones only;
    # applies to items without a delay).
    fifo: bool = False
    # The caller chose the id: part one checks the id's outcome record (dedupe window).
    check_outcome: bool = False
    # The id was generated for this enqueue: until an attempt to write it has run, no
    # record of it can exist, so the first attempt skips the read that makes a retry
    # (after commit_unknown_result) find what it wrote. Cleared for the retries.
    fresh_id: bool = False
    # An idempotency or debounce key of the zone (quickzones.store.flow_keys), handled by
    # the enqueue's part one in the enqueuing transaction.
    flow: FlowKey | None = None


def new_record(item: NewItem, item_id: str, now: int, vesting_ms: int) -> WorkItem:
    """The stored record of ``item`` enqueued at ``now`` (store ms) under ``item_id``,
    vesting at ``vesting_ms`` (``vesting_after`` its delay), as every zone store writes it
    (the KV zones add a FIFO item's commit order)."""
    return WorkItem(
        item_id=item_id,
        job_type=item.job_type,
        payload=item.payload,
        priority=item.priority,
        vesting_ms=vesting_ms,
        enqueued_ms=now,
        content_type=item.content_type,
        deadline_ms=None if item.ttl_ms is None else now + item.ttl_ms,
        delivery=item.delivery,
        meta=dict(item.meta),
    )


@dataclass(frozen=True, slots=True)
class ZoneStoreCapabilities:
    """What a zone store supports beyond the protocol's item operations. ``Quick`` checks
    these once, where a call needs one, and raises
    :class:`~quickzones.errors.UnsupportedByStore` naming the capability and the store."""

    # A handler's effects and its item's completion commit in one KV transaction.
    transactional_handlers: bool = False
    # Items ordered by commit versionstamp (``fifo=True``).
    fifo: bool = False
    # Local work items (the cluster's own maintenance work) live in this store.
    local_items: bool = False
    # Items written inside a caller's KV transaction (``enqueue(..., tr=tr)``, batches).
    caller_transactions: bool = False
    # Finished items leave outcome records (status after completion, results, dedupe).
    # Left out of equality so capability sets compared as the first four still compare
    # equal (tests/unit/test_capabilities.py); read it by name.
    outcome_records: bool = field(default=False, compare=False)
    # A dequeue joins a KV transaction (``tr``) of the store that holds the pointers, so a
    # Manager's visit (pointer lease, dequeue, requeue) can commit once
    # (:class:`VisitTransactions`).
    one_transaction_visits: bool = field(default=False, compare=False)
    # A dequeue also takes items that vest within ``horizon_ms`` and nobody holds, their
    # leases counted from their vesting time (:class:`VisitTransactions`): a consumer
    # leases an item due soon ahead and starts it on its own timer.
    lookahead_dequeue: bool = field(default=False, compare=False)
    # Batches and chains: a batch's callback item is written in the transaction that
    # finishes its last item (quickzones.store.batches), so items and the top-level queue
    # share one KV store.
    batches: bool = field(default=False, compare=False)
    # Idempotency and debounce keys: the key's record and the item commit together, and
    # the key is released in the transaction finishing the item (KV zones only).
    flow_keys: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class CorruptItem:
    """An item whose record could not be decoded, surfaced so it can be dead-lettered."""

    item_id: str
    reason: str


class ZoneStore(Protocol):
    """Item operations on queue zones (paper section 5)."""

    @property
    def capabilities(self) -> ZoneStoreCapabilities:
        """What this store supports beyond the operations below."""
        ...

    def enqueue(
        self,
        zone: ZoneId,
        item: NewItem,
        *,
        tr: KVTransaction | None = None,
        in_pointer_txn: Callable[[KVTransaction], None] | None = None,
    ) -> str:
        """Store ``item`` and make sure the zone has a pointer (the two-part enqueue of
        :mod:`quickzones.store.enqueue`); returns the item id.

        With ``tr`` (stores with ``caller_transactions`` only) the enqueue joins the
        caller's transaction and commits with it. ``in_pointer_txn`` runs inside the KV
        transaction that checks the pointer. A caller-chosen ``item_id`` makes the
        enqueue idempotent: the same job (type and payload) again is a no-op, another job
        under a queued id raises :class:`~quickzones.store.outcomes.DuplicateItemMismatch`.
        """
        ...

    def enqueue_many(
        self,
        zone: ZoneId,
        items: Sequence[NewItem],
        *,
        in_pointer_txn: Callable[[KVTransaction, int], None] | None = None,
    ) -> list[str]:
        """Enqueue several items into one zone: in one KV transaction with one pointer
        check where the store can, else one enqueue each. ``in_pointer_txn(tr, n)`` runs in
        each KV transaction that checks the pointer, told how many items it enqueues."""
        ...

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        """Up to ``max_items`` vested items, by priority; within one, items keyed by vesting
        time first (in vesting order), then FIFO items in commit order. No lease taken."""
        ...

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        start_now: int | None = None,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease up to ``max_items`` vested items ``accept`` takes; returned items
        carry lease ids. Corrupt and expired items are dead-lettered on the way.

        ``resolve`` lets the consumer apply its job types' delivery and TTL to items whose
        producer did not know them, before the store decides what to do with each.
        ``start_now``: the first this many leases start at once (attempts + 1 at the
        grant); the rest are leased held (``WorkItem.held``: no run counted, nothing
        counted if the lease lapses) until :meth:`start` counts the run. None: all.
        """
        ...

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem: ...

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since."""
        ...

    def start(self, zone: ZoneId, item_id: str, lease_id: str) -> WorkItem:
        """A Worker's check before it starts a leased item that waited for it (Algorithm
        3): ``ItemNotFound`` if it was completed or cancelled, ``LeaseLost`` if another
        holds it; else the stored item. A read where the run was counted when the lease
        was granted (``attempts`` + 1; a lapsed lease's count goes to the next lease, and
        ``lapses`` + 1); a write for a held lease (``WorkItem.held``), which it turns into
        a started one, counting the run."""
        ...

    def requeue(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str,
        delay_ms: int,
        *,
        error: str | None = None,
        count_error: bool = True,
        meta: dict[str, object] | None = None,
        not_before_ms: int | None = None,
        ran: bool = True,
    ) -> WorkItem:
        """Release the lease and vest the item again after ``delay_ms``, and not before
        ``not_before_ms`` (store ms); error count + 1 unless ``count_error`` is False;
        ``meta`` is merged into the item's metadata; ``ran=False``: the item never
        started under this lease, whose count (``attempts``) is taken back."""
        ...

    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        result: Any = None,
        tr: KVTransaction = ...,
    ) -> None:
        """Delete the item; with a lease id only for its holder, without one it cancels.
        ``result``: the handler's return value, kept if the item's type asks. With ``tr``
        the delete joins that transaction (transactional handlers; KV zones only)."""
        ...

    def record_outcome(
        self,
        zone: ZoneId,
        item: WorkItem,
        state: str,
        *,
        result: Any = None,
        reason: str | None = None,
    ) -> None:
        """Write the outcome record of an item already gone from its zone, if its type
        keeps one: an at-most-once item, deleted as its handler started, whose run ended
        (``state`` completed, with ``result``; or failed, with ``reason``). Stores without
        ``outcome_records`` do nothing."""
        ...

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,
    ) -> list[Exception | None]:
        """Complete several leased items at once; one outcome per (item_id, lease_id).
        ``results``: handlers' return values by item id, kept if the item's type asks."""
        ...

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None: ...

    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction = ...) -> int | None:
        """Vesting time of the zone's next item, or None if the zone is empty. With ``tr``
        (the pointer requeue's transaction): a KV zone reads it inside ``tr`` (with a
        conflict), an external store with a strong read ordered by ``tr``'s read version."""
        ...

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        """Strong emptiness check, called inside the KV transaction that would delete the
        zone's pointer, after that transaction's read version is fixed."""
        ...

    def count(self, zone: ZoneId) -> int: ...

    def counts(self, zones: list[ZoneId]) -> list[int]:
        """The item counts of ``zones``, in their order, read at once where the store can
        (a page or a metrics scrape counts many zones, not one transaction a zone)."""
        ...

    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
    ) -> None:
        """Move an item to the dead-letter store (only its lease holder, if ``lease_id``),
        keeping the whole item. With ``lease_id`` the holder's failed run counts as an error
        (error count + 1, last error ``reason``), so error count and attempts agree;
        ``traceback`` is kept (bounded) with the dead letter."""
        ...

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        """Remove an undecodable item (after it has been dead-lettered)."""
        ...


class VisitTransactions(Protocol):
    """A zone store whose dequeue joins a transaction of the pointers' KV store
    (capability ``one_transaction_visits``) and takes items ahead of their vesting time
    (``horizon_ms``, capability ``lookahead_dequeue``)."""

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        horizon_ms: int = 0,
        start_now: int | None = None,
        tr: KVTransaction = ...,
    ) -> tuple[list[WorkItem], list[CorruptItem]]: ...

    def start(
        self, zone: ZoneId, item_id: str, lease_id: str, *, tr: KVTransaction = ...
    ) -> WorkItem: ...

"""The zone store seam: what consumers need from wherever work items live.

Two implementations: :class:`quick_core.zones.KVZoneStore` (items in the same KV store as
the pointers, every operation a KV transaction) and ``adapters.cassandra.CassandraZoneStore``
(items in Cassandra, paper section 6.1). Consumers see only this protocol and the
top-level queue, never a backend.

Failure kinds are distinguishable: :class:`~quick_core.errors.ItemNotFound` (completed,
cancelled or never there), :class:`~quick_core.errors.LeaseLost` (someone else holds it),
:class:`~quick_core.errors.ItemNotVested` (not available to lease yet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quick_core.kv import KVTransaction
from quick_core.records import WorkItem, ZoneId


@dataclass(frozen=True, slots=True)
class NewItem:
    """What a producer hands to enqueue; the zone store fills in times and the id."""

    job_type: str
    payload: bytes
    delay_ms: int = 0
    priority: int = 0
    item_id: str | None = None
    content_type: str = "bytes"
    ttl_ms: int | None = None
    delivery: str = "at_least_once"
    meta: dict[str, Any] = field(default_factory=dict)
    # Order by commit versionstamp among this priority's other FIFO items (KV zones only;
    # applies to items without a delay).
    fifo: bool = False


@dataclass(frozen=True, slots=True)
class CorruptItem:
    """An item whose record could not be decoded, surfaced so it can be dead-lettered."""

    item_id: str
    reason: str


class ZoneStore(Protocol):
    """Item operations on queue zones (paper section 5)."""

    def enqueue(self, zone: ZoneId, item: NewItem, *, tr: KVTransaction | None = None) -> str:
        """Store ``item`` and make sure the zone has a pointer; returns the item id.

        With ``tr`` (KV zones only) the enqueue joins the caller's transaction and commits
        with it. A caller-chosen ``item_id`` makes the enqueue idempotent.
        """
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
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease up to ``max_items`` vested items ``accept`` takes; returned items
        carry lease ids. Corrupt and expired items are dead-lettered on the way.

        ``resolve`` lets the consumer apply its job types' delivery and TTL to items whose
        producer did not know them, before the store decides what to do with each.
        """
        ...

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem: ...

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since."""
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
    ) -> WorkItem:
        """Release the lease and vest the item again after ``delay_ms``; error count + 1
        unless ``count_error`` is False; ``meta`` is merged into the item's metadata."""
        ...

    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        tr: KVTransaction | None = None,
    ) -> None:
        """Delete the item; with a lease id only for its holder, without one it cancels."""
        ...

    def complete_many(
        self, zone: ZoneId, leased: Sequence[tuple[str, str]]
    ) -> list[Exception | None]:
        """Complete several leased items at once; one outcome per (item_id, lease_id)."""
        ...

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None: ...

    def min_vesting_ms(self, zone: ZoneId) -> int | None:
        """Vesting time of the zone's next item, or None if the zone is empty."""
        ...

    def min_vesting_in(self, tr: KVTransaction, zone: ZoneId) -> int | None:
        """The zone's earliest vesting time, for the pointer requeue in ``tr``: a KV zone
        reads it inside ``tr`` (with a conflict), an external store with a strong read."""
        ...

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        """Strong emptiness check, called inside the KV transaction that would delete the
        zone's pointer, after that transaction's read version is fixed."""
        ...

    def count(self, zone: ZoneId) -> int: ...

    def dead_letter(self, zone: ZoneId, item_id: str, lease_id: str | None, reason: str) -> None:
        """Move an item to the dead-letter store (only its lease holder, if ``lease_id``)."""
        ...

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        """Remove an undecodable item (after it has been dead-lettered)."""
        ...

"""The external-store enqueue of Cassandra zones (paper section 6.1): the item into
Cassandra first, then the pointer transaction in the KV store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from quickzones.adapters.cassandra.driver import CassandraError
from quickzones.adapters.cassandra.plans import ConditionalWrites
from quickzones.clock import now_ms, vesting_after
from quickzones.errors import ConfigurationError
from quickzones.store import enqueue as two_part
from quickzones.store.kv import KVTransaction
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.validation import check_name
from quickzones.store.zones import new_item_id
from quickzones.store.zonestore import NewItem, new_record

log = logging.getLogger("quick.cassandra")

NO_FIFO = (
    "FIFO by commit versionstamp needs KV zones: Cassandra zones order items by vesting time only"
)


def _check_same_job(zone: ZoneId, queued: WorkItem, asked: WorkItem) -> None:
    """Only the same job (type and payload) under a queued id is an idempotent repeat;
    another is refused, never silently dropped (issue 28, point 8)."""
    if queued.job_type != asked.job_type:
        raise DuplicateItemMismatch(str(zone), asked.item_id, "queued", "job type")
    if (queued.payload, queued.content_type) != (asked.payload, asked.content_type):
        raise DuplicateItemMismatch(str(zone), asked.item_id, "queued")


class ExternalEnqueue(ConditionalWrites):
    """``enqueue`` and ``enqueue_many`` of Cassandra zones."""

    def enqueue(
        self,
        zone: ZoneId,
        item: NewItem,
        *,
        tr: KVTransaction | None = None,
        in_pointer_txn: Callable[[KVTransaction], None] | None = None,
    ) -> str:
        """The paper's external-store enqueue: write the item to Cassandra, then one KV
        transaction that reads the pointer index and creates the pointer or declares a
        write conflict on the index key (so a pointer deletion that read it aborts).

        If that transaction fails, the item written here is deleted again and the error
        raised: the caller was not told the item exists, so it must not run. A crash
        between the two steps leaves an item without a pointer; re-enqueueing the same id
        (idempotent) creates the pointer. ``in_pointer_txn`` runs inside the pointer
        transaction (rate-limit charges). Joining a caller's KV transaction (``tr``) is not
        possible: the item must be in Cassandra before any pointer transaction commits.
        """
        if item.fifo:
            raise ConfigurationError(NO_FIFO)
        if tr is not None:
            raise ConfigurationError(
                "Cassandra zones cannot enqueue inside a KV transaction: the item is "
                "written to Cassandra before the pointer transaction (paper section 6.1)"
            )
        record = self._new_record(item)
        found: list[WorkItem] = []

        def write() -> tuple[int, bool]:
            stored, inserted = self._insert_new(zone, record)
            if not inserted:
                found.append(stored)
            return stored.vesting_ms, inserted

        two_part.enqueue_external(
            self.kv,
            self.toplevel,
            zone,
            write_item=write,
            collect_item=lambda: self._collect(zone, record),
            charge=in_pointer_txn,
        )
        if found:  # after the pointer check: a queued item missing its pointer gets one
            _check_same_job(zone, found[0], record)
        return record.item_id

    def enqueue_many(
        self,
        zone: ZoneId,
        items: Sequence[NewItem],
        *,
        in_pointer_txn: Callable[[KVTransaction, int], None] | None = None,
    ) -> list[str]:
        """One external-store enqueue per item (each its own Cassandra write and pointer
        transaction): a batch cannot be atomic across Cassandra and the KV store."""
        charge = in_pointer_txn

        def charge_one(tr: KVTransaction) -> None:
            if charge is not None:
                charge(tr, 1)

        return [self.enqueue(zone, item, in_pointer_txn=charge_one) for item in items]

    def _new_record(self, item: NewItem) -> WorkItem:
        now = now_ms(self.clock)
        item_id = item.item_id if item.item_id is not None else new_item_id(self.ids)
        check_name("item_id", item_id)
        vesting = vesting_after(self.clock, item.delay_ms) if item.delay_ms else now
        # A nonce, so a SERIAL re-read after a timed-out insert tells our row from an
        # earlier enqueue of the same id (the item's own meta is not stored here).
        return new_record(item, item_id, now, vesting).with_(meta={"_w": self.ids(4)})

    def _insert_new(self, zone: ZoneId, record: WorkItem) -> tuple[WorkItem, bool]:
        """Insert the item and its order entry if the id is new. Returns (the stored item,
        whether this call inserted it)."""
        z = (zone.app, zone.tenant)
        statements = [
            (self.table.ins_item_nx, (*z, record.item_id, *self.table.fields(record))),
            (self.table.ins_order, (*z, record.priority, record.vesting_ms, record.item_id)),
        ]
        for _ in range(3):
            outcome = self.table.cas(statements)
            if outcome is True:
                return record, True
            current = self.table.read_one(zone, record.item_id, serial=True)
            if current is not None:
                mine = current.meta.get("_w") == record.meta["_w"]
                return current, mine
            if outcome is False:
                continue  # refused, yet gone at SERIAL: completed in between; insert again
        raise CassandraError(f"could not insert item {record.item_id!r}")

    def _collect(self, zone: ZoneId, record: WorkItem) -> None:
        """Delete an item whose pointer transaction failed (best effort, logged)."""
        try:
            self._apply(
                zone,
                record.item_id,
                lambda item: (
                    None
                    if item is None or item.meta.get("_w") != record.meta.get("_w")
                    else self._plan_delete(zone, item)
                ),
                fresh=True,
            )
        except CassandraError as err:
            log.warning(
                "enqueue of %s in %s failed and its item could not be collected (%s): it "
                "has no pointer and runs only when the zone gets one",
                record.item_id,
                zone,
                err,
            )

"""CassandraZoneStore: queue zones whose items live in Cassandra (paper section 6.1).

Pointers stay in the KV store (FoundationDB in production); items live in one Cassandra
partition per zone (see :mod:`quickzones.adapters.cassandra.schema`). Every change to an item is a
lightweight transaction: a conditional batch on the item row ``IF lease_id = ? AND
vesting_ms = ?`` (the state the caller read) that also moves the item's order entry. The
pair (lease_id, vesting_ms) changes on every transition, so two consumers can never both
take the same item, and a stale reader's write is refused instead of applied.

A write that times out after it was sent may or may not have been applied. It is never
guessed: the item is re-read at SERIAL (which finishes any in-progress Paxos round) and
the outcome read off the row; if that read fails too, a :class:`CassandraError` with
``outcome_unknown`` is raised and the item's lease simply expires. No timeout turns into a
lost item.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quickzones.adapters.cassandra.driver import (
    CassandraError,
)
from quickzones.adapters.cassandra.schema import ITEM_COLUMNS
from quickzones.adapters.cassandra.table import ZoneTable
from quickzones.clock import Clock, SystemClock, ms_up, now_ms
from quickzones.errors import (
    ConfigurationError,
    CorruptRecord,
    InvalidArgument,
    ItemNotFound,
    ItemNotVested,
    LeaseLost,
)
from quickzones.store import enqueue as two_part
from quickzones.store.ids import IdSource
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.records import MAX_TRACEBACK, DeadLetter, WorkItem, ZoneId, encode_item
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.validation import MIN_PRIORITY, check_name
from quickzones.store.zones import new_item_id, new_lease_id
from quickzones.store.zonestore import CorruptItem, NewItem, ZoneStoreCapabilities

log = logging.getLogger("quick.cassandra")

# A conditional write refused this many times in a row (contention) is reported, not looped.
CAS_ATTEMPTS = 8
# Where a dead row keeps its failure's traceback (the table has no column for it).
TRACEBACK_META = "_traceback"


NO_FIFO = (
    "FIFO by commit versionstamp needs KV zones: Cassandra zones order items by vesting time only"
)


@dataclass(frozen=True, slots=True)
class _Plan:
    """One item's conditional change: the statements to run and how to recognise, on a
    SERIAL re-read, that they were applied (for writes whose outcome is unknown)."""

    item: WorkItem  # as read: the condition
    statements: list[tuple[Any, tuple[Any, ...]]]
    result: WorkItem | None  # the new row; None when the item is deleted

    def applied(self, row: WorkItem | None) -> bool:
        if self.result is None:
            return row is None
        return (
            row is not None
            and row.lease_id == self.result.lease_id
            and row.vesting_ms == self.result.vesting_ms
        )


class CassandraZoneStore:
    """The :class:`~quickzones.store.zonestore.ZoneStore` over Cassandra, pointers over ``kv``.

    ``session`` is a connected cassandra-driver Session; ``keyspace`` holds the table made
    by :func:`quickzones.adapters.cassandra.schema.init_schema`. Plain reads and writes use
    ``consistency`` (QUORUM by default); lightweight transactions and the reads that must
    observe them use ``serial_consistency`` (SERIAL).
    """

    # An item's Cassandra write cannot join a KV transaction: no transactional handlers, no
    # enqueue inside a caller's transaction, no commit-versionstamp order, and local work
    # items stay in KV zones.
    capabilities: ZoneStoreCapabilities = ZoneStoreCapabilities()

    def __init__(
        self,
        session: Any,
        keyspace: str,
        kv: KVStore,
        toplevel: TopLevelQueue,
        *,
        table: str = "zone_rows",
        consistency: str = "QUORUM",
        serial_consistency: str = "SERIAL",
        timeout_s: float = 10.0,
        clock: Clock | None = None,
        owner: Any = None,
        ids: IdSource | None = None,
    ) -> None:
        self.session = session
        self.keyspace = keyspace
        self.table = ZoneTable(
            session,
            keyspace,
            table,
            consistency=consistency,
            serial_consistency=serial_consistency,
            timeout_s=timeout_s,
        )
        self.kv = kv
        self.toplevel = toplevel
        self.clock = clock or SystemClock()
        self.ids = ids or toplevel.ids
        self._owner = owner  # a Cluster this store opened and must shut down

    def close(self) -> None:
        if self._owner is not None:
            self._owner.shutdown()
            self._owner = None

    # --- plans: one item's conditional change --------------------------------------------

    def _cond(self, item: WorkItem) -> tuple[str, int]:
        return (item.lease_id or "", item.vesting_ms)

    def _plan_update(self, zone: ZoneId, old: WorkItem, new: WorkItem) -> _Plan:
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (
                self.table.upd_item_if,
                (
                    new.vesting_ms,
                    new.lease_id or "",
                    new.attempts,
                    new.error_count,
                    new.last_error,
                    self.table.fields(new)[-1],
                    *z,
                    old.item_id,
                    *self._cond(old),
                ),
            )
        ]
        if (old.priority, old.vesting_ms) != (new.priority, new.vesting_ms):
            statements.append(
                (self.table.del_order, (*z, old.priority, old.vesting_ms, old.item_id))
            )
            statements.append(
                (self.table.ins_order, (*z, new.priority, new.vesting_ms, new.item_id))
            )
        return _Plan(old, statements, new)

    def _plan_delete(
        self,
        zone: ZoneId,
        old: WorkItem,
        dead_reason: str | None = None,
        *,
        count_error: bool = False,
        traceback: str | None = None,
    ) -> _Plan:
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (self.table.del_item_if, (*z, old.item_id, *self._cond(old))),
            (self.table.del_order, (*z, old.priority, old.vesting_ms, old.item_id)),
        ]
        if dead_reason is not None:
            kept = old.with_(lease_id=None)
            if count_error:
                kept = kept.with_(error_count=old.error_count + 1, last_error=dead_reason)
            if traceback is not None:
                # The row has no traceback column: it rides in the dead row's metadata
                # (no schema change) and dead_letters() takes it out again.
                kept = kept.with_(meta={**kept.meta, TRACEBACK_META: traceback[-MAX_TRACEBACK:]})
            statements.append(
                (
                    self.table.ins_dead,
                    (
                        *z,
                        old.item_id,
                        *self.table.fields(kept),
                        dead_reason[:2000],
                        now_ms(self.clock),
                    ),
                )
            )
        return _Plan(old, statements, None)

    def _apply(
        self,
        zone: ZoneId,
        item_id: str,
        decide: Callable[[WorkItem | None], _Plan | None],
        *,
        first: WorkItem | None = None,
        fresh: bool = False,
    ) -> WorkItem | None:
        """Read the item, let ``decide`` plan a change (or raise), run it conditionally;
        on refusal re-read at SERIAL and decide again. Returns the plan's new row (None
        for a delete, or when ``decide`` planned nothing)."""
        item = first
        read = first is not None
        for attempt in range(CAS_ATTEMPTS):
            if not read:
                item = self.table.read_one(zone, item_id, serial=attempt > 0 or fresh)
            read = False
            plan = decide(item)
            if plan is None:
                return None
            outcome = self.table.cas(plan.statements)
            if outcome is None:
                current = self.table.read_one(zone, item_id, serial=True)
                if plan.applied(current):
                    return plan.result
                # Not applied: the refused or lost write changed nothing; decide again.
                item, read = current, True
                continue
            if outcome:
                return plan.result
        raise CassandraError(f"item {item_id!r}: {CAS_ATTEMPTS} conditional writes refused")

    # --- enqueue -----------------------------------------------------------------------

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

        def write() -> tuple[int, bool]:
            stored, inserted = self._insert_new(zone, record)
            return stored.vesting_ms, inserted

        two_part.enqueue_external(
            self.kv,
            self.toplevel,
            zone,
            write_item=write,
            collect_item=lambda: self._collect(zone, record),
            charge=in_pointer_txn,
        )
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
        return WorkItem(
            item_id=item_id,
            job_type=item.job_type,
            payload=item.payload,
            priority=item.priority,
            # Delayed: from the clock's reading rounded up, never before now + delay.
            vesting_ms=ms_up(self.clock.now() + item.delay_ms / 1000) if item.delay_ms else now,
            enqueued_ms=now,
            content_type=item.content_type,
            deadline_ms=None if item.ttl_ms is None else now + item.ttl_ms,
            delivery=item.delivery,
            # A nonce, so a SERIAL re-read after a timed-out insert tells our row from an
            # earlier enqueue of the same id.
            meta={"_w": self.ids(4)},
        )

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

    # --- reading -----------------------------------------------------------------------

    def _vested_entries(self, zone: ZoneId, max_items: int, now: int) -> list[tuple[int, int, str]]:
        """(priority, vesting, item_id) of up to ``max_items`` vested order entries, in
        order: per priority present, one read finds it and one reads its vested entries."""
        z = (zone.app, zone.tenant)
        out: list[tuple[int, int, str]] = []
        cursor = MIN_PRIORITY
        while len(out) < max_items:
            first = self.table.read(self.table.sel_next_priority, (*z, cursor))
            if not first:
                break
            priority = first[0].o_priority
            rows = self.table.read(self.table.sel_vested, (*z, priority, now, max_items - len(out)))
            out.extend((r.o_priority, r.o_vesting, r.item_id) for r in rows)
            cursor = priority + 1
        return out

    def _read_many(self, zone: ZoneId, ids: list[str]) -> dict[str, Any]:
        if not ids:
            return {}
        rows = self.table.read(self.table.sel_items, (zone.app, zone.tenant, ids))
        return {r.item_id: r for r in rows}

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        now = now_ms(self.clock)
        entries = self._vested_entries(zone, max_items, now)
        rows = self._read_many(zone, [e[2] for e in entries])
        out = []
        for _, vesting, item_id in entries:
            row = rows.get(item_id)
            if row is None:
                continue
            try:
                item = self.table.to_item(zone, row)
            except CorruptRecord:
                continue
            if item.vesting_ms == vesting:
                out.append(item)
        return out

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None:
        return self.table.read_one(zone, item_id, serial=False)

    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction | None = None) -> int | None:
        """The zone's earliest vesting time from Cassandra, or None if it is empty.

        With ``tr`` (a pointer requeue's transaction) the read is ordered by it: ``tr``'s
        read version is fixed first and the pointer index key joins its read conflict set.
        An enqueue whose pointer transaction commits after this read version declared a
        write conflict on that key, so the requeue aborts and retries, and its retry reads
        Cassandra after that item was written. Without it the pointer could be requeued at
        a later time than the new item's.
        """
        if tr is not None:
            tr.get_read_version()
            tr.add_read_conflict_key(self._index_key(zone))
        z = (zone.app, zone.tenant)
        best: int | None = None
        cursor = MIN_PRIORITY
        while True:
            first = self.table.read(self.table.sel_next_priority, (*z, cursor))
            if not first:
                return best
            vesting = first[0].o_vesting
            best = vesting if best is None else min(best, vesting)
            cursor = first[0].o_priority + 1

    def _index_key(self, zone: ZoneId) -> bytes:
        tl = self.toplevel
        return tl.keys.pointer_index_key(tl.cluster, tl.shard_for(zone), zone)

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        """Strong emptiness check inside the pointer-deleting transaction ``tr``.

        ``tr``'s read version is fixed before Cassandra is read (at SERIAL, so an
        in-progress conditional insert is finished or refused first): an enqueue whose
        pointer transaction committed before that version wrote its item before, so the
        read sees it; one committing after conflicts on the pointer index key. A failed
        read raises, and no pointer is deleted on a guess.
        """
        tr.get_read_version()
        rows = self.table.read(self.table.sel_any_item, (zone.app, zone.tenant), serial=True)
        return not rows

    def count(self, zone: ZoneId) -> int:
        rows = self.table.read(self.table.sel_count, (zone.app, zone.tenant))
        return int(rows[0][0]) if rows else 0

    def zones(self, page_size: int = 500) -> Iterator[ZoneId]:
        """Every zone (partition) with rows, in token order, read page by page."""
        for row in self.table.pages(self.table.sel_zones, (), page_size, "zone listing"):
            yield ZoneId(row.app, row.tenant)

    def items(self, zone: ZoneId, page_size: int = 500) -> Iterator[WorkItem | CorruptItem]:
        """Every item of a zone (leased or not), page by page, in id order."""
        params = (zone.app, zone.tenant)
        for row in self.table.pages(self.table.sel_zone_items, params, page_size, "item listing"):
            try:
                yield self.table.to_item(zone, row)
            except CorruptRecord as err:
                yield CorruptItem(row.item_id, err.reason)

    # --- leases ------------------------------------------------------------------------

    def _lease_plan(self, zone: ZoneId, item: WorkItem, now: int, lease_ms: int) -> _Plan:
        # A run is counted when a Worker starts it (start), not when it is leased.
        leased = item.with_(vesting_ms=now + lease_ms, lease_id=new_lease_id(self.ids))
        return self._plan_update(zone, item, leased)

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem:
        _check_duration(lease_ms)

        def decide(item: WorkItem | None) -> _Plan:
            if item is None:
                raise ItemNotFound(item_id)
            now = now_ms(self.clock)
            if item.vesting_ms > now:
                raise ItemNotVested(item_id, item.vesting_ms)
            return self._lease_plan(zone, item, now, lease_ms)

        leased = self._apply(zone, item_id, decide)
        assert leased is not None
        return leased

    def _dequeue_plan(
        self,
        zone: ZoneId,
        item: WorkItem,
        now: int,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
    ) -> tuple[_Plan | None, str]:
        """What a dequeue does to one vested item: ("lease" | "at_most_once" | "expired" |
        "skip", plan)."""
        if resolve is not None:
            item = resolve(item)
        if item.vesting_ms > now:
            return None, "skip"
        if item.deadline_ms is not None and now > item.deadline_ms:
            return self._plan_delete(zone, item, "expired: not started before its TTL"), "expired"
        if accept is not None and not accept(item):
            return None, "skip"
        # At-most-once items are leased too: the consumer deletes one when its handler
        # starts, so one taken but never started is given back, not lost.
        return self._lease_plan(zone, item, now, lease_ms), "lease"

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Peek and lease in one conditional batch (one Paxos round for the whole visit).

        If the batch is refused (another consumer changed an item) each item is retried on
        its own. Expired and corrupt items are dead-lettered on the way, so neither
        blocks the zone.
        """
        _check_duration(lease_ms)
        now = now_ms(self.clock)
        entries = self._vested_entries(zone, max_items, now)
        rows = self._read_many(zone, [e[2] for e in entries])
        z = (zone.app, zone.tenant)
        plans: list[tuple[_Plan, str]] = []
        corrupt: list[CorruptItem] = []
        repairs: list[tuple[Any, tuple[Any, ...]]] = []
        for priority, vesting, item_id in entries:
            row = rows.get(item_id)
            if row is None:
                # An order entry without its item (completed between the two reads, or a
                # resurrected entry): deleting it is harmless either way.
                repairs.append((self.table.del_order, (*z, priority, vesting, item_id)))
                continue
            try:
                item = self.table.to_item(zone, row)
            except CorruptRecord as err:
                self._drop_row(zone, row, err.reason)
                corrupt.append(CorruptItem(item_id, err.reason))
                continue
            if item.vesting_ms != vesting:
                continue  # moved since the index read; its current entry is elsewhere
            plan, kind = self._dequeue_plan(zone, item, now, lease_ms, accept, resolve)
            if plan is not None:
                plans.append((plan, kind))
        if repairs:
            try:
                self.table.write(repairs)
            except CassandraError:
                pass  # the next visit repairs them
        if not plans:
            return [], corrupt
        outcome = self.table.cas([s for plan, _ in plans for s in plan.statements])
        taken: list[WorkItem] = []
        for plan, kind in plans:
            if outcome:
                result: WorkItem | None = plan.result
                done = True
            else:
                result, done = self._dequeue_one(zone, plan, kind, lease_ms, accept, resolve)
            if not done:
                continue
            if kind == "lease" and result is not None:
                taken.append(result)
            elif kind == "at_most_once":
                taken.append(
                    plan.item.with_(
                        lease_id=new_lease_id(self.ids), attempts=plan.item.attempts + 1
                    )
                )
        return taken, corrupt

    def _dequeue_one(
        self,
        zone: ZoneId,
        plan: _Plan,
        kind: str,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
    ) -> tuple[WorkItem | None, bool]:
        """Retry one item of a refused (or unknown) batch. Returns (result, taken)."""
        item_id = plan.item.item_id
        try:
            current = self.table.read_one(zone, item_id, serial=True)
        except CassandraError:
            return None, False  # a lease we may hold expires on its own
        if kind in ("lease", "expired") and plan.applied(current):
            return plan.result, True  # the batch was applied after all
        if kind == "at_most_once" and current is None:
            # Gone: maybe our delete, maybe another consumer's. Not knowing, do not run it:
            # at-most-once allows not running, never running twice.
            return None, False
        chosen: list[str] = []

        def decide(item: WorkItem | None) -> _Plan | None:
            if item is None:
                return None
            new_plan, new_kind = self._dequeue_plan(
                zone, item, now_ms(self.clock), lease_ms, accept, resolve
            )
            chosen[:] = [new_kind]
            return new_plan

        try:
            result = self._apply(zone, item_id, decide, first=current)
        except CassandraError:
            return None, False
        if not chosen or chosen[0] in ("skip", "expired"):
            return None, False
        return result, chosen[0] == "lease"

    def _check_holder(self, item: WorkItem | None, item_id: str, lease_id: str) -> WorkItem:
        if item is None:
            raise ItemNotFound(item_id)
        if item.lease_id != lease_id:
            raise LeaseLost(item_id)
        return item

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """Holds while the caller holds the lease, or it expired and nobody leased since."""
        _check_duration(lease_ms)

        def decide(item: WorkItem | None) -> _Plan:
            held = self._check_holder(item, item_id, lease_id)
            return self._plan_update(
                zone, held, held.with_(vesting_ms=now_ms(self.clock) + lease_ms)
            )

        result = self._apply(zone, item_id, decide)
        assert result is not None
        return result

    def start(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        """A Worker's check before it starts an item: the holder renews its lease and the
        run is counted (``attempts`` + 1). Lapses of started runs are not tracked here."""
        _check_duration(lease_ms)

        def decide(item: WorkItem | None) -> _Plan:
            held = self._check_holder(item, item_id, lease_id)
            renewed = held.with_(
                vesting_ms=now_ms(self.clock) + lease_ms, attempts=held.attempts + 1
            )
            return self._plan_update(zone, held, renewed)

        result = self._apply(zone, item_id, decide)
        assert result is not None
        return result

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
    ) -> WorkItem:
        def decide(item: WorkItem | None) -> _Plan:
            held = self._check_holder(item, item_id, lease_id)
            return self._plan_update(
                zone,
                held,
                held.with_(
                    vesting_ms=max(now_ms(self.clock) + max(0, delay_ms), not_before_ms or 0),
                    lease_id=None,
                    error_count=held.error_count + (1 if count_error else 0),
                    last_error=error if error is not None else held.last_error,
                    meta={**held.meta, **meta} if meta else held.meta,
                ),
            )

        result = self._apply(zone, item_id, decide)
        assert result is not None
        return result

    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        tr: KVTransaction | None = None,
        result: Any = None,  # no outcome records here (capabilities.outcome_records)
    ) -> None:
        """Delete the item (only for its holder, with ``lease_id``). ``tr`` is refused:
        a Cassandra delete cannot commit atomically with a KV transaction, so
        transactional (exactly-once) handlers need KV zones."""
        if tr is not None:
            raise ConfigurationError(
                "complete(..., tr=...) is not supported for Cassandra zones: the item's "
                "delete cannot join a KV transaction; use KV zones for transactional handlers"
            )
        done = [False]

        def decide(item: WorkItem | None) -> _Plan | None:
            if item is None:
                if done[0]:
                    return None
                raise ItemNotFound(item_id)
            if lease_id is not None and item.lease_id != lease_id:
                raise LeaseLost(item_id)
            done[0] = True
            return self._plan_delete(zone, item)

        self._apply(zone, item_id, decide)

    def cancel(self, zone: ZoneId, item_id: str) -> None:
        """Delete an item whoever holds it."""
        self.complete(zone, item_id, None)

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,  # no outcome records here
    ) -> list[Exception | None]:
        """One conditional batch for the zone; if refused, each item on its own so an item
        another holder took is reported, not fatal."""
        rows = self._read_many(zone, [i for i, _ in leased])
        out: list[Exception | None] = []
        plans: list[_Plan] = []
        for item_id, lease_id in leased:
            row = rows.get(item_id)
            try:
                item = self._check_holder(
                    None if row is None else self.table.to_item(zone, row), item_id, lease_id
                )
            except (ItemNotFound, LeaseLost, CorruptRecord) as err:
                out.append(err)
                continue
            plans.append(self._plan_delete(zone, item))
            out.append(None)
        if not plans:
            return out
        if self.table.cas([s for p in plans for s in p.statements]):
            return out
        for n, (item_id, lease_id) in enumerate(leased):
            if out[n] is not None:
                continue
            try:
                self.complete(zone, item_id, lease_id)
            except ItemNotFound:
                out[n] = None  # our refused-or-unknown batch may have deleted it
                try:
                    if self.table.read_one(zone, item_id, serial=True) is not None:
                        out[n] = LeaseLost(item_id)
                except CassandraError as err:
                    out[n] = err
            except (LeaseLost, CorruptRecord, CassandraError) as err:
                out[n] = err
        return out

    # --- dead letters ------------------------------------------------------------------

    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
    ) -> None:
        """Move the item to the zone's dead letters (rows of kind 2 in the same partition,
        so the move is one conditional batch). With ``lease_id`` the holder's failed run
        counts as an error, as in the KV zone store."""

        def decide(item: WorkItem | None) -> _Plan:
            if item is None:
                raise ItemNotFound(item_id)
            if lease_id is not None and item.lease_id != lease_id:
                raise LeaseLost(item_id)
            return self._plan_delete(
                zone, item, reason, count_error=lease_id is not None, traceback=traceback
            )

        self._apply(zone, item_id, decide)

    def _drop_row(self, zone: ZoneId, row: Any, reason: str) -> None:
        """Dead-letter an undecodable item row with whatever fields it has, and delete it
        with its order entry."""
        z = (zone.app, zone.tenant)
        statements: list[tuple[Any, tuple[Any, ...]]] = [
            (self.table.del_item, (*z, row.item_id)),
            (
                self.table.ins_dead,
                (
                    *z,
                    row.item_id,
                    *(getattr(row, c) for c in ITEM_COLUMNS),
                    reason,
                    now_ms(self.clock),
                ),
            ),
        ]
        if row.priority is not None and row.vesting_ms is not None:
            statements.append(
                (self.table.del_order, (*z, row.priority, row.vesting_ms, row.item_id))
            )
        try:
            self.table.write(statements)
        except CassandraError as err:
            log.warning("could not dead-letter corrupt item %s in %s: %s", row.item_id, zone, err)

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        rows = self.table.read(self.table.sel_item, (zone.app, zone.tenant, item_id))
        if rows:
            self._drop_row(zone, rows[0], "corrupt record")

    def dead_letters(self, zone: ZoneId) -> list[DeadLetter]:
        out = []
        for row in self.table.read(self.table.sel_dead, (zone.app, zone.tenant)):
            try:
                item: WorkItem | None = self.table.to_item(zone, row)
            except CorruptRecord:
                item = None
            tb: str | None = None
            if item is not None and TRACEBACK_META in item.meta:
                meta = dict(item.meta)
                tb = str(meta.pop(TRACEBACK_META))
                item = item.with_(meta=meta)
            raw = encode_item(item) if item is not None else b""
            out.append(
                DeadLetter(
                    zone, row.item_id, row.dead_reason or "", row.dead_at_ms or 0, item, raw, tb
                )
            )
        return out

    def purge_dead_letter(self, zone: ZoneId, item_id: str) -> None:
        self.table.write([(self.table.del_dead, (zone.app, zone.tenant, item_id))])


def _check_duration(lease_ms: int) -> None:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
        raise InvalidArgument("lease duration", lease_ms, "must be a positive number of ms")

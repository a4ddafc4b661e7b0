"""Queue zones whose items are rows of the native SQL items table (docs/backends.md,
"Zones native in SQL"): the :class:`~quickzones.store.zonestore.ZoneStore` of
``sqlite:///...?zones=sql`` and ``postgresql://...?zones=sql``.

An item is one row: the columns a zone's order needs (priority, vesting time, enqueue
order, lease id) beside its record (:func:`~quickzones.store.records.encode_item`, as the
KV zones store it). On SQLite every write is one transaction under the file's write lock,
so the two-part enqueue is one transaction of two statements (the item; the pointer made,
or pulled earlier when it vests later and nobody leases it: part two cannot conflict, and
an enqueue is one commit); on PostgreSQL a lone enqueue is one statement, its row locks
ordering it with the pointer's other writers, and an application's enqueue
(``Quick.enqueue_on``) locks the pointer ``FOR KEY SHARE`` in the application's
transaction and pulls it after that COMMIT (:meth:`SQLZoneStore._write_shared`). A lease,
a requeue or a completion is one more statement. What a lease does to an item is
:mod:`quickzones.store.lease_rules`, as for every zone store.

Dead letters go to the KV zones' dead-letter records (``quick dead-letters`` and the admin
read them there): written first, in a KV transaction of their own, then the item deleted
(a crash between leaves the item, to run or be dead-lettered again; never a lost one). A
KV commit never runs under the write lock this store holds on SQLite (both take it), so
an expired or corrupt item met by a dequeue is dead-lettered after the dequeue's
transaction.

Not here yet (absent from the capabilities, so ``Quick`` refuses them by name):
transactional handlers, FIFO, local items, enqueues inside a KV transaction, outcome
records, batches, flow keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quickzones.clock import Clock, now_ms, vesting_after
from quickzones.errors import (
    ConfigurationError,
    CorruptRecord,
    ItemNotFound,
    ItemNotVested,
    StorageError,
)
from quickzones.store import lease_rules
from quickzones.store.enqueue import Enqueued
from quickzones.store.ids import IdSource
from quickzones.store.kv import NOT_COMMITTED, OWN_STORE, KVError, KVStore, KVTransaction, run
from quickzones.store.outcomes import DuplicateItemMismatch
from quickzones.store.records import WorkItem, ZoneId, decode_item, encode_item
from quickzones.store.sql.connections import SQLConnections, SQLTransaction, retrying
from quickzones.store.sql.item_floors import Floor, ItemFloors
from quickzones.store.sql.statements import Statements, delete_rows, lease_rows
from quickzones.store.sql.toplevel import SQLTopLevelQueue, zone_key
from quickzones.store.validation import check_name
from quickzones.store.zones import KVZoneStore, check_lease_duration, new_item_id, new_lease_id
from quickzones.store.zones.budget import TransactionBudget
from quickzones.store.zones.dequeue import Left
from quickzones.store.zones.items import lease_lost
from quickzones.store.zonestore import CorruptItem, NewItem, ZoneStoreCapabilities, new_record

EXPIRED = "expired: not started before its TTL"
# How long after an application's enqueue a pointer made for it vests (its part two pulls
# it to the item after the COMMIT; this bounds the item's wait where part two is lost).
PARKED_MS = 5_000
STALE_SNAPSHOT = (
    "the application's transaction reads a snapshot older than the zone's pointer;"
    " roll it back and run it again"
)
# Reads of an item that another writer changed before this one's write, before giving up.
CHANGE_TRIES = 16
# How far past its horizon a dequeue read looks for the zone's next vesting time
# (``dequeue_read``'s part 2); where it finds nothing by then, the pointer is requeued to
# vest then, and a read that finds nothing at all looks on unbounded (part 4: is the
# zone empty?). Beside a report's snapshot each item completed within the item lease
# keeps its leased version ahead of now: a read to the zone's next vesting time fetched
# each (141 buffers a read, 270 reads a second, in the hold of ``python -m
# bench.pg_long_txn``), bounded 69.
NEXT_VESTING_AHEAD_MS = 2_000


@dataclass(slots=True)
class _Decided:
    """What a dequeue decided for the rows it read."""

    grants: list[tuple[WorkItem, bytes]] = field(default_factory=list)
    expired: list[tuple[WorkItem, bytes]] = field(default_factory=list)
    corrupt: list[tuple[str, bytes, str]] = field(default_factory=list)

    @property
    def corrupt_items(self) -> list[CorruptItem]:
        return [CorruptItem(item_id, reason) for item_id, _, reason in self.corrupt]


@dataclass(slots=True)
class _ToTake:
    """A dequeue's read (:meth:`SQLZoneStore._read_to_take`): the rows it may take (id,
    record, vesting time), whether a vested one is left beyond them, and, where
    ``known``, the earliest vesting time of the zone's other items (None: none)."""

    rows: list[tuple[Any, Any, int]]
    more: bool
    later: int | None
    known: bool

    def tell(self, left: Left, now: int, decided: _Decided, leased: list[WorkItem]) -> None:
        """Fill ``left`` with what this read saw of the zone once ``leased`` are written:
        a vested item left, or the zone's next vesting time (each leased item's lease end,
        every row not leased as read, the items after ``now``), unless a lease was not
        written (its row changed since the read: its vesting time is not known here)."""
        left.vested_ms = now if self.more else None
        left.next_known = self.known and len(leased) == len(decided.grants)
        if not left.next_known:
            left.next_ms = None
            return
        taken = {item.item_id for item in leased}
        times = [item.vesting_ms for item in leased]
        times += [int(vesting) for item_id, _, vesting in self.rows if str(item_id) not in taken]
        if self.later is not None:
            times.append(int(self.later))
        left.next_ms = min(times, default=None)


@dataclass(slots=True)
class _SentRead:
    """A dequeue's read (``dequeue_read``) sent for up to ``n`` items as of ``now``, its
    answer read by :meth:`take`. Sent ahead by a visit (``send_dequeue_read``), it may
    have asked for more than the dequeue then takes."""

    now: int
    n: int
    horizon_ms: int
    result: Any
    # Where its part 2 stopped looking for the zone's next vesting time.
    ahead_ms: int
    # The zone, the floor it read from, and the floors told what it saw.
    zone: bytes
    floor: Floor
    floors: ItemFloors

    def fits(self, max_items: int, horizon_ms: int) -> bool:
        """Whether it read what a dequeue taking up to ``max_items`` reads."""
        return max_items <= self.n and horizon_ms == self.horizon_ms

    def take(self, max_items: int) -> _ToTake:
        """The rows a dequeue taking up to ``max_items`` may take, as a read of exactly
        ``max_items`` would give them. The zone's next vesting time is known only where
        it read every vested row and none ahead: with more asked for, rows ahead may
        stand where the exact read found none, and then the earliest later one was not
        read."""
        vested: list[tuple[Any, Any, int]] = []
        ahead: list[tuple[Any, Any, int]] = []
        later = None
        vested_keys: list[tuple[Any, Any]] = []
        snapshot = None
        unbounded = None
        for part, item_id, record, priority, vesting, _ in self.result:
            if part == 0:
                vested.append((item_id, record, vesting))
                vested_keys.append((priority, vesting))
            elif part == 1:
                ahead.append((item_id, record, vesting))
            elif part == 2:
                later = vesting
            elif part == 4:
                unbounded = vesting
            else:  # the snapshot's oldest running and next transaction ids (PostgreSQL)
                snapshot = (int(priority), int(vesting))
        if later is None and len(vested) <= self.n and not ahead:
            # Part 2 looked to ``ahead_ms`` and found nothing: with nothing to take either,
            # part 4 looked on (None: the zone is empty); else the next vesting time is
            # not known past ``ahead_ms``, and the pointer vests then (never late).
            later = unbounded if not vested else self.ahead_ms
        self.floors.learn(
            self.zone,
            self.floor,
            self.now,
            [(int(priority), int(vesting)) for priority, vesting in vested_keys],
            complete=len(vested) <= self.n,
            snapshot=snapshot,
        )
        more = len(vested) > max_items
        known = not more and not ahead
        ahead = [] if more else ahead[: max_items - len(vested)]
        return _ToTake(vested[:max_items] + ahead, more, later, known=known)


class SQLZoneStore:
    """Zones in the native SQL items table; pointers in :class:`SQLTopLevelQueue`."""

    capabilities: ZoneStoreCapabilities = ZoneStoreCapabilities(
        lookahead_dequeue=True, one_transaction_visits=True
    )

    def __init__(
        self,
        sql: SQLConnections,
        statements: Statements,
        toplevel: SQLTopLevelQueue,
        kv: KVStore,
        letters: KVZoneStore,
        *,
        clock: Clock,
        ids: IdSource,
    ) -> None:
        self.sql = sql
        self.q = statements
        self.toplevel = toplevel
        self.kv = kv
        # The KV zones, which keep this store's dead letters.
        self.letters = letters
        self.clock = clock
        self.ids = ids
        # Where each zone's dequeue read starts (past its completed items' entries).
        self.floors = ItemFloors()

    def create_tables(self) -> None:
        """Make the tables where the store has none (a new file, or one of the KV layout
        that never had native zones), or move a store's pointers of the layout before
        pointer versions into them, in one transaction holding the store's schema lock:
        processes opening a new store at once make them one at a time (PostgreSQL's
        ``CREATE TABLE IF NOT EXISTS`` is no guard against another doing it meanwhile)."""
        made = {"table": self.q.zones_table}
        with self.sql.sql_read() as c:
            if c.execute(self.q.table_exists, made).fetchone() is not None:
                return  # every table and index is made in the one transaction below

        def make() -> None:
            with self.sql.sql_schema() as c:
                if c.execute(self.q.table_exists, made).fetchone() is not None:
                    return  # made by another process meanwhile
                # Pointers of the layout before versions (a unique row a zone): moved over.
                old = {"table": self.q.pointers_table}
                before = c.execute(self.q.table_exists, old).fetchone() is not None
                if before:
                    c.execute(self.q.migrate_rename)
                for statement in self.q.schema:
                    c.execute(statement)
                if before:
                    for statement in self.q.migrate_copy:
                        c.execute(statement)

        # Again where it failed retryably (through a pooler in transaction mode, the first
        # statement prepared on another server connection).
        retrying(self.kv, make)

    # --- the two-part enqueue, natively --------------------------------------------------

    def enqueue(
        self,
        zone: ZoneId,
        item: NewItem,
        *,
        tr: KVTransaction | None = None,
        in_pointer_txn: Callable[[KVTransaction], None] | None = None,
    ) -> str:
        """Both parts in one transaction: the item's row, then the zone's pointer made
        or pulled earlier. A caller-chosen id already in the zone writes nothing (the
        same job: ``duplicate`` "queued"; another: :class:`DuplicateItemMismatch`) and
        gives a zone that lost its pointer one. ``in_pointer_txn`` (the app's
        enqueue-rate charge) runs first in a KV transaction of its own."""
        if tr is not None and not isinstance(tr, SQLTransaction):
            raise ConfigurationError("zones=sql cannot enqueue inside a KV transaction")
        if in_pointer_txn is not None:
            run(self.kv, in_pointer_txn)
        return self._enqueue(zone, [item], tr)[0]

    def enqueue_many(
        self,
        zone: ZoneId,
        items: Sequence[NewItem],
        *,
        in_pointer_txn: Callable[[KVTransaction, int], None] | None = None,
    ) -> list[str]:
        """Every item and one pointer statement, in one transaction."""
        if in_pointer_txn is not None:
            charge = in_pointer_txn
            run(self.kv, lambda t: charge(t, len(items)))
        return self._enqueue(zone, items) if items else []

    def _enqueue(
        self, zone: ZoneId, items: Sequence[NewItem], on: SQLTransaction | None = None
    ) -> list[str]:
        """Both parts for ``items``: in a transaction of their own, or in ``on``, the
        application's open transaction on its own connection (``Quick.enqueue_on``)."""
        now = now_ms(self.clock)  # before the lock: a steady clock may write the store
        key = zone_key(zone)
        records = [self._record(item, now) for item in items]
        args = [
            {"zone": key, "id": r.item_id, "priority": r.priority, "vesting_ms": r.vesting_ms,
             "record": encode_item(r)}
            for r in records
        ]  # fmt: skip
        pointer = self.toplevel.pointer_args(zone, min(r.vesting_ms for r in records), now)
        queued: dict[str, WorkItem] = {}
        if on is not None and self.q.enqueue_shared is not None:
            self._write_shared(on, zone, records, args, now, queued)
        elif on is not None:  # SQLite: the application's transaction holds the write lock
            self._write_new(on.conn, zone, records, args, pointer, queued)
        elif len(records) == 1 and self.q.enqueue_one is not None:
            # One statement, its own transaction: one round trip.
            def one() -> bool:
                with self.sql.sql_write_one() as c:
                    wrote, woke, again = c.execute(
                        self.q.enqueue_one, {**args[0], **pointer}
                    ).fetchone()
                    if woke:
                        self.sql.signal_commit(c)
                    if not wrote:  # the id is queued: the same job, or refused
                        queued[records[0].item_id] = self._found(c, zone, records[0])
                return bool(again)

            if retrying(self.kv, one):
                # The item is committed; its pointer changed after the statement's
                # snapshot, or was collected: made or pulled again on its own.
                self.toplevel.upsert_alone(pointer)
        else:

            def all_of_them() -> None:
                with self.sql.sql_write() as c:
                    self._write_new(c, zone, records, args, pointer, queued)

            retrying(self.kv, all_of_them)
        # A fresh (random) id found queued is this call's own write, committed by an
        # attempt whose answer was lost (a retry): no duplicate.
        return [
            Enqueued(r.item_id, "queued" if r.item_id in queued and not item.fresh_id else None)
            for r, item in zip(records, items, strict=True)
        ]

    def _write_new(
        self,
        c: Any,
        zone: ZoneId,
        records: list[WorkItem],
        args: list[dict[str, Any]],
        pointer: dict[str, Any],
        queued: dict[str, WorkItem],
    ) -> None:
        """The items' rows and the pointer's upsert on ``c``, in its transaction; the ids
        already queued go to ``queued`` (each checked to be the same job)."""
        for record, row in zip(records, args, strict=True):
            if c.execute(self.q.insert_item_returning, row).fetchone() is None:
                queued[record.item_id] = self._found(c, zone, record)
        if self.toplevel.upsert(c, pointer):
            # Made, or pulled earlier: consumers elsewhere may sleep past it. (One that
            # vests in time already, or is leased, they know of.)
            self.sql.signal_commit(c)

    def _write_shared(
        self,
        on: SQLTransaction,
        zone: ZoneId,
        records: list[WorkItem],
        args: list[dict[str, Any]],
        now: int,
        queued: dict[str, WorkItem],
    ) -> None:
        """Part one in an application's transaction where rows have locks of their own
        (PostgreSQL): the items' rows and the zone's pointer locked ``FOR KEY SHARE``,
        which holds nothing another enqueuer of the zone or a consumer's lease or
        requeue needs, only its deletion (pointer collection skips it). A zone without a
        pointer gets one parked (:meth:`SQLTopLevelQueue.park_pointer`), then locked.
        Part two pulls the pointer to the items once the application has committed
        (:meth:`SQLTransaction.after_commit`; always: a consumer may have requeued it
        past them meanwhile, not seeing them yet)."""
        c = on.conn
        key = zone_key(zone)
        cluster = self.toplevel.cluster
        wrote, held, on.app_txid, isolation = c.execute(
            self.q.enqueue_shared, {**args[0], "cluster": cluster}
        ).fetchone()
        if not wrote:
            queued[records[0].item_id] = self._found(c, zone, records[0])
        for record, row in zip(records[1:], args[1:], strict=True):
            if c.execute(self.q.insert_item_returning, row).fetchone() is None:
                queued[record.item_id] = self._found(c, zone, record)
        vesting_ms = min(r.vesting_ms for r in records)
        share = {"cluster": cluster, "zone": key}
        if not held and isolation != "read committed":
            # A pointer parked now would be invisible to the application's snapshot:
            # made in its transaction instead (one made by another since that snapshot is
            # a serialization failure, which the application retries, as at these
            # levels it must anyway).
            made = self.toplevel.pointer_args(zone, vesting_ms, now)
            if not self.toplevel.make(c, made):
                raise KVError(NOT_COMMITTED, STALE_SNAPSHOT)
            held = True
        for _ in range(CHANGE_TRIES):
            if held:
                break
            self.toplevel.park_pointer(zone, now, now + PARKED_MS)
            held = c.execute(self.q.share_pointer, share).fetchone() is not None
        else:
            raise StorageError(f"the pointer of {zone} was collected {CHANGE_TRIES} times")
        on.after_commit(functools.partial(self.toplevel.pull_later, zone, vesting_ms))
        on.after_commit(self.toplevel.flush_pulls)

    def _found(self, c: Any, zone: ZoneId, asked: WorkItem) -> WorkItem:
        """The queued item of ``asked``'s id: only the same job (type and payload) is an
        idempotent repeat; another is refused, never silently dropped (issue 28, point 8)."""
        queued = self._read(c, zone, asked.item_id)
        if queued is None:
            raise StorageError(f"item {asked.item_id!r} of {zone} neither inserted nor found")
        if queued.job_type != asked.job_type:
            raise DuplicateItemMismatch(str(zone), asked.item_id, "queued", "job type")
        if (queued.payload, queued.content_type) != (asked.payload, asked.content_type):
            raise DuplicateItemMismatch(str(zone), asked.item_id, "queued")
        return queued

    def _record(self, item: NewItem, now: int) -> WorkItem:
        if item.fifo or item.flow is not None:
            raise ConfigurationError("zones=sql has no FIFO order nor flow keys yet")
        item_id = item.item_id if item.item_id is not None else new_item_id(self.ids)
        check_name("item_id", item_id)
        vesting = vesting_after(self.clock, item.delay_ms) if item.delay_ms else now
        return new_record(item, item_id, now, vesting)

    # --- rows ------------------------------------------------------------------------------

    def _read(self, c: Any, zone: ZoneId, item_id: str) -> WorkItem | None:
        row = c.execute(self.q.item, {"zone": zone_key(zone), "id": item_id}).fetchone()
        return None if row is None else decode_item(item_id.encode(), bytes(row[0]))

    def _write_if(self, c: Any, zone: ZoneId, item: WorkItem, was: bytes) -> bool:
        """Write ``item`` where its row still holds the record ``was``; whether it did."""
        done = c.execute(
            self.q.update_item,
            {"zone": zone_key(zone), "id": item.item_id, "vesting_ms": item.vesting_ms,
             "lease_id": item.lease_id, "record": encode_item(item), "was": was},
        )  # fmt: skip
        return bool(done.rowcount)

    def _write_leases(
        self, zone: ZoneId, grants: list[tuple[WorkItem, bytes]], conn: Any = None
    ) -> list[WorkItem]:
        """Write each leased item where its row still holds the record read, in one
        statement (on ``conn``, else its own transaction); the items written, in order."""
        if not grants:
            return []
        sql, args = self._lease_statement(zone, grants)
        if conn is not None:
            written = {str(i) for (i,) in conn.execute(sql, args).fetchall()}
        else:
            with self.sql.sql_write_one() as c:
                written = {str(i) for (i,) in c.execute(sql, args).fetchall()}
        return [item for item, _ in grants if item.item_id in written]

    def _lease_statement(
        self, zone: ZoneId, grants: list[tuple[WorkItem, bytes]]
    ) -> tuple[str, dict[str, Any]]:
        """The statement writing ``grants`` where each row still holds the record read,
        returning the ids written."""
        args: dict[str, Any] = {"zone": zone_key(zone)}
        for k, (item, was) in enumerate(grants):
            args[f"i{k}"], args[f"v{k}"] = item.item_id, item.vesting_ms
            args[f"l{k}"], args[f"r{k}"], args[f"w{k}"] = item.lease_id, encode_item(item), was
        return lease_rows(self.q.items_table, self.q.dialect, len(grants)), args

    def _send_leases(
        self, zone: ZoneId, grants: list[tuple[WorkItem, bytes]], tr: SQLTransaction
    ) -> list[WorkItem]:
        """The leases of a one-transaction visit: where ``tr`` sends statements later, sent
        with its commit (a round trip less a zone) and taken as written; once committed,
        an item whose row changed since the read (cancelled, leased by id meanwhile) is
        dropped from the list returned, never handed out, and the zone's pointer, requeued
        as if it were leased, is pulled to now for the next visit to read the zone. Else
        written at once (:meth:`_write_leases`)."""
        if not grants or not tr.sends_later():
            return self._write_leases(zone, grants, tr.conn)
        sent = tr.conn.execute(*self._lease_statement(zone, grants))
        leased = [item for item, _ in grants]

        def written() -> None:
            kept = {str(i) for (i,) in sent.fetchall()}
            lost = [item for item in leased if item.item_id not in kept]
            if not lost:
                return
            leased[:] = [item for item in leased if item.item_id in kept]
            self.toplevel.pull_pointer_earlier(zone, now_ms(self.clock))

        tr.after_commit(written)
        return leased

    def _read_raw(self, zone: ZoneId, item_id: str) -> tuple[WorkItem, bytes] | None:
        with self.sql.sql_read() as c:
            row = c.execute(self.q.item, {"zone": zone_key(zone), "id": item_id}).fetchone()
        if row is None:
            return None
        raw = bytes(row[0])
        return decode_item(item_id.encode(), raw), raw

    def _change(
        self, zone: ZoneId, item_id: str, change: Callable[[WorkItem], WorkItem]
    ) -> WorkItem:
        """Read the item, then write ``change(item)`` (which raises to write nothing)
        where the row is still as read, else read it again: the Python work runs outside
        the write lock, which holds one statement."""
        for _ in range(CHANGE_TRIES):
            found = self._read_raw(zone, item_id)
            if found is None:
                raise ItemNotFound(item_id)
            item, raw = found
            changed = change(item)
            with self.sql.sql_write_one() as c:
                if self._write_if(c, zone, changed, raw):
                    return changed
        raise StorageError(f"item {item_id!r} of {zone} changed under {CHANGE_TRIES} tries")

    def _holder(self, item: WorkItem, lease_id: str, now: int) -> WorkItem:
        if item.lease_id != lease_id:
            raise lease_lost(item, lease_id, now)
        return item

    # --- reads -----------------------------------------------------------------------------

    def get(self, zone: ZoneId, item_id: str) -> WorkItem | None:
        with self.sql.sql_read() as c:
            return self._read(c, zone, item_id)

    def peek(self, zone: ZoneId, max_items: int) -> list[WorkItem]:
        args = {"zone": zone_key(zone), "upto": now_ms(self.clock), "n": max_items}
        with self.sql.sql_read() as c:
            rows = c.execute(self.q.vested, args).fetchall()
        return [decode_item(str(i).encode(), bytes(raw)) for i, raw in rows]

    def min_vesting_ms(self, zone: ZoneId, *, tr: KVTransaction = OWN_STORE) -> int | None:
        """The zone's next vesting time; inside a pointer requeue's transaction
        (:class:`SQLTransaction`) read under its lock."""
        row = self._fetch(tr, self.q.min_vesting, zone)
        return None if row is None else row[0]

    def zone_is_empty(self, tr: KVTransaction, zone: ZoneId) -> bool:
        return self._fetch(tr, self.q.any_item, zone) is None

    def _fetch(self, tr: object, sql: str, zone: ZoneId) -> Any:
        """One row of ``sql`` about ``zone``: inside ``tr`` where it is a native write
        transaction, else in a snapshot of its own."""
        args = {"zone": zone_key(zone)}
        if isinstance(tr, SQLTransaction):
            return tr.conn.execute(sql, args).fetchone()
        with self.sql.sql_read() as c:
            return c.execute(sql, args).fetchone()

    def count(self, zone: ZoneId) -> int:
        with self.sql.sql_read() as c:
            return int(c.execute(self.q.count, {"zone": zone_key(zone)}).fetchone()[0])

    def counts(self, zones: list[ZoneId]) -> list[int]:
        with self.sql.sql_read() as c:
            return [
                int(c.execute(self.q.count, {"zone": zone_key(z)}).fetchone()[0]) for z in zones
            ]

    # --- leases ------------------------------------------------------------------------------

    def dequeue(
        self,
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        *,
        accept: Callable[[WorkItem], bool] | None = None,
        resolve: Callable[[WorkItem], WorkItem] | None = None,
        start_now: int | None = None,
        horizon_ms: int = 0,
        budget: TransactionBudget | None = None,
        left: Left | None = None,
        tr: KVTransaction = OWN_STORE,
    ) -> tuple[list[WorkItem], list[CorruptItem]]:
        """Lease up to ``max_items`` vested items ``accept`` takes; the first
        ``start_now`` start at once, the rest are leased held (None: all start). With
        ``horizon_ms``, where the vested items leave room, unleased items vesting within
        that many ms are leased too, held, each lease counted from its vesting time (the
        consumer starts them on its own timer). Expired and corrupt items are
        dead-lettered once it committed (see the module).

        On its own: the vested rows read, decided outside any lock, each lease written
        where its row still holds the record read (an item changed meanwhile is left for
        the next visit), in one statement. Inside a one-transaction visit's ``tr``
        (:meth:`SQLTopLevelQueue.run_visit`, which holds the zone's pointer): the same
        statements on its connection, at most what ``budget`` lets the transaction carry,
        and ``left`` told the vesting time of a vested item read and not taken (the
        pointer's requeue then needs no read of the zone)."""
        check_lease_duration(lease_ms)
        if horizon_ms < 0:
            raise ValueError(f"horizon_ms must be at least 0, not {horizon_ms}")
        now = now_ms(self.clock)
        if isinstance(tr, SQLTransaction):
            sent = tr.ahead.pop(("dequeue", zone), None)
            if sent is not None and sent.fits(max_items, horizon_ms):
                now = sent.now  # what it read is as of then
            else:
                sent = self._send_read(tr.conn, zone, max_items, now, horizon_ms)
            read = sent.take(max_items)
            decided = self._decide(read.rows, now, max_items, lease_ms, accept, resolve,
                                   start_now, budget)  # fmt: skip
            if left is not None and left.taking is not None:
                left.taking(len(decided.grants))
            leased = self._send_leases(zone, decided.grants, tr)
            if left is not None:
                read.tell(left, now, decided, leased)
            tr.after_commit(lambda: self._finish(zone, decided))
            return leased, decided.corrupt_items
        with self.sql.sql_read() as c:
            read = self._read_to_take(c, zone, max_items, now, horizon_ms)
        decided = self._decide(read.rows, now, max_items, lease_ms, accept, resolve, start_now,
                               budget)  # fmt: skip
        leased = self._write_leases(zone, decided.grants)
        self._finish(zone, decided)
        return leased, decided.corrupt_items

    def _read_to_take(
        self, c: Any, zone: ZoneId, max_items: int, now: int, horizon_ms: int
    ) -> _ToTake:
        """The rows a dequeue may take, in one statement (:meth:`_send_read`)."""
        return self._send_read(c, zone, max_items, now, horizon_ms).take(max_items)

    def _send_read(
        self, c: Any, zone: ZoneId, max_items: int, now: int, horizon_ms: int
    ) -> _SentRead:
        """Send ``dequeue_read``: the vested rows (one more is read: in a zone with a
        backlog it tells the requeue the zone's next vesting time), then, with a horizon
        and room, the unleased ones due within it; and where it read every vested row and
        none ahead, the zone's next vesting time after ``now``."""
        key = zone_key(zone)
        floor = self.floors.floor(key, now)
        upto = now + horizon_ms
        ahead = upto + NEXT_VESTING_AHEAD_MS
        args = {"zone": key, "now": now, "upto": upto, "ahead": ahead, "n": max_items}
        result = c.execute(self.q.dequeue_read, {**args, **floor.args()})
        return _SentRead(now, max_items, horizon_ms, result, ahead, key, floor, self.floors)

    def send_dequeue_read(
        self, zone: ZoneId, max_items: int, horizon_ms: int, tr: KVTransaction
    ) -> bool:
        """Send the read a dequeue of ``zone`` taking up to ``max_items`` (with
        ``horizon_ms``) makes in ``tr`` now, where ``tr`` sends statements later: the
        dequeue reads its answer (:meth:`dequeue`); whether it did."""
        if not isinstance(tr, SQLTransaction) or not tr.sends_later():
            return False
        tr.ahead[("dequeue", zone)] = self._send_read(
            tr.conn, zone, max_items, now_ms(self.clock), horizon_ms
        )
        return True

    def _decide(
        self,
        rows: list[tuple[Any, Any, int]],
        now: int,
        max_items: int,
        lease_ms: int,
        accept: Callable[[WorkItem], bool] | None,
        resolve: Callable[[WorkItem], WorkItem] | None,
        start_now: int | None,
        budget: TransactionBudget | None,
    ) -> _Decided:
        """What a dequeue does with each row: a lease (held or started), a dead letter
        (expired or corrupt), or nothing (refused by ``accept``, past the budget)."""
        decided = _Decided()
        starting = max_items if start_now is None else start_now
        for item_id, stored, _ in rows:
            raw = bytes(stored)
            try:
                item = decode_item(str(item_id).encode(), raw)
            except CorruptRecord as err:
                decided.corrupt.append((str(item_id), raw, err.reason))
                continue
            if resolve is not None:
                item = resolve(item)
            if item.deadline_ms is not None and now > item.deadline_ms:
                decided.expired.append((item, raw))
                continue
            if accept is not None and not accept(item):
                continue  # e.g. its job type is at its concurrency cap: left vested
            if budget is not None and not budget.admit(len(raw)):
                break  # the rest stays vested for the next visit
            since = max(now, item.vesting_ms)  # an item taken ahead: from its vesting
            held = since > now or starting <= 0
            if not held:
                starting -= 1
            lease = new_lease_id(self.ids)
            decided.grants.append(
                (lease_rules.granted(item, since, lease_ms, lease, held=held), raw)
            )
        return decided

    def _finish(self, zone: ZoneId, decided: _Decided) -> None:
        """A dequeue's dead letters, once its leases committed (in KV transactions)."""
        for item, raw in decided.expired:
            self._bury(zone, item, raw, EXPIRED, count_error=False)
        for item_id, raw, reason in decided.corrupt:
            self.letters.keep_corrupt_letter(zone, item_id, raw, reason)
            self._delete_if(zone, item_id, raw)

    def obtain_lease(self, zone: ZoneId, item_id: str, lease_ms: int) -> WorkItem:
        check_lease_duration(lease_ms)
        now = now_ms(self.clock)
        lease = new_lease_id(self.ids)

        def grant(item: WorkItem) -> WorkItem:
            if item.vesting_ms > now:
                raise ItemNotVested(item_id, item.vesting_ms)
            return lease_rules.granted(item, now, lease_ms, lease)

        return self._change(zone, item_id, grant)

    def extend_lease(self, zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> WorkItem:
        check_lease_duration(lease_ms)
        now = now_ms(self.clock)
        return self._change(
            zone,
            item_id,
            lambda item: lease_rules.extended(self._holder(item, lease_id, now), now, lease_ms),
        )

    def start(self, zone: ZoneId, item_id: str, lease_id: str) -> WorkItem:
        """A read where the run was counted at the grant; a held lease becomes a started
        one (a write)."""
        now = now_ms(self.clock)
        item = self._holder(self._get_or_raise(zone, item_id), lease_id, now)
        if not item.held:
            return item

        def begin(current: WorkItem) -> WorkItem:
            held = self._holder(current, lease_id, now)
            return lease_rules.started(held) if held.held else held

        return self._change(zone, item_id, begin)

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
        now = now_ms(self.clock)
        vesting = max(vesting_after(self.clock, delay_ms), not_before_ms or 0)
        return self._change(
            zone,
            item_id,
            lambda item: lease_rules.requeued(
                self._holder(item, lease_id, now),
                vesting,
                error=error,
                count_error=count_error,
                meta=meta,
                ran=ran,
            ),
        )

    def _get_or_raise(self, zone: ZoneId, item_id: str) -> WorkItem:
        item = self.get(zone, item_id)
        if item is None:
            raise ItemNotFound(item_id)
        return item

    # --- completion ------------------------------------------------------------------------

    def complete(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None = None,
        *,
        result: Any = None,
        tr: KVTransaction = OWN_STORE,
    ) -> None:
        """Delete the item: with a lease id only for its holder; without one, a cancel."""
        if tr is not OWN_STORE:
            raise ConfigurationError("zones=sql cannot complete inside a KV transaction")
        error = self._complete(zone, [(item_id, lease_id)])[0]
        if error is not None:
            raise error

    def complete_many(
        self,
        zone: ZoneId,
        leased: Sequence[tuple[str, str]],
        *,
        results: Mapping[str, Any] | None = None,
    ) -> list[Exception | None]:
        """One transaction of deletes, each only where its lease still holds; an item
        whose delete found no row is read to say why (gone, or another's lease)."""
        return self._complete(zone, leased)

    def _complete(
        self, zone: ZoneId, leased: Sequence[tuple[str, str | None]]
    ) -> list[Exception | None]:
        now = now_ms(self.clock)
        key = zone_key(zone)
        done: set[str] = set()  # the ids deleted (each once, by the first entry naming it)
        with self.sql.sql_write_one() as c:
            for leased_only in (True, False):
                part = [(i, lease) for i, lease in leased if (lease is not None) == leased_only]
                if not part:
                    continue
                args: dict[str, Any] = {"zone": key}
                for k, (item_id, lease_id) in enumerate(part):
                    args[f"i{k}"] = item_id
                    if leased_only:
                        args[f"l{k}"] = lease_id
                sql = delete_rows(self.q.items_table, self.q.dialect, len(part), leased=leased_only)
                done.update(str(i) for (i,) in c.execute(sql, args).fetchall())
        out: list[Exception | None] = []
        for item_id, lease_id in leased:
            if item_id in done:
                done.discard(item_id)  # an id named twice completes once
                out.append(None if lease_id is None or self._held_by(item_id, lease_id, leased)
                           else ItemNotFound(item_id))  # fmt: skip
                continue
            item = self.get(zone, item_id)  # only for a delete that found no row: why
            if item is None or lease_id is None:
                out.append(ItemNotFound(item_id))
            else:
                out.append(lease_lost(item, lease_id, now))
        return out

    @staticmethod
    def _held_by(item_id: str, lease_id: str, leased: Sequence[tuple[str, str | None]]) -> bool:
        """Whether ``lease_id`` is the first lease named with ``item_id`` in ``leased`` (a
        delete by id and lease matches only the lease the item held: with two leases
        named for one id, the first that matches is the one that held it)."""
        return next(lease for i, lease in leased if i == item_id) == lease_id

    def record_outcome(
        self,
        zone: ZoneId,
        item: WorkItem,
        state: str,
        *,
        result: Any = None,
        reason: str | None = None,
    ) -> None:
        """No outcome records here (the capability is off): nothing to write."""

    # --- dead letters ------------------------------------------------------------------------

    def dead_letter(
        self,
        zone: ZoneId,
        item_id: str,
        lease_id: str | None,
        reason: str,
        *,
        traceback: str | None = None,
    ) -> None:
        with self.sql.sql_read() as c:
            row = c.execute(self.q.item, {"zone": zone_key(zone), "id": item_id}).fetchone()
        if row is None:
            raise ItemNotFound(item_id)
        raw = bytes(row[0])
        item = decode_item(item_id.encode(), raw)
        if lease_id is not None:
            self._holder(item, lease_id, now_ms(self.clock))
        self._bury(zone, item, raw, reason, count_error=lease_id is not None, traceback=traceback)

    def _bury(
        self,
        zone: ZoneId,
        item: WorkItem,
        raw: bytes,
        reason: str,
        *,
        count_error: bool,
        traceback: str | None = None,
    ) -> None:
        """The dead letter first, then the item's row, only where it is still ``raw``,
        as read (nobody leased, requeued or finished it since)."""
        self.letters.keep_dead_letter(
            zone, item, reason, count_error=count_error, traceback=traceback
        )
        self._delete_if(zone, item.item_id, raw)

    def _delete_if(self, zone: ZoneId, item_id: str, record: bytes) -> None:
        with self.sql.sql_write_one() as c:
            c.execute(self.q.delete_item_if, {"zone": zone_key(zone), "id": item_id, "was": record})

    def drop_corrupt(self, zone: ZoneId, item_id: str) -> None:
        with self.sql.sql_read() as c:
            row = c.execute(self.q.item, {"zone": zone_key(zone), "id": item_id}).fetchone()
        if row is None:
            return
        raw = bytes(row[0])
        self.letters.keep_corrupt_letter(zone, item_id, raw, "corrupt record")
        self._delete_if(zone, item_id, raw)

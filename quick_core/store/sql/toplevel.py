"""The top-level queue over the native SQL zones' pointer table (docs/backends.md, "Zones
native in SQL"): one row a non-empty zone, indexed by (shard, vesting time) for the scan.

Everything about the cluster that is not a pointer (the layout, the local zone's name,
ids, the clock) is the KV top-level queue's, whose class this one extends; every
operation on a pointer is a statement here. On SQLite writes run under the file's write
lock (``BEGIN IMMEDIATE``), so a requeue that reads the zone's next vesting time, or a
collection that finds the zone empty, cannot miss an enqueue: none commits in between
(invariant 2 without conflict ranges). On PostgreSQL the pointer's row lock does it: a
requeue locks the pointer ``FOR NO KEY UPDATE`` and reads the zone after, a collection
deletes only a pointer it could lock ``FOR UPDATE`` (which no application's open enqueue
holds ``FOR KEY SHARE``), and an application's enqueue that committed after the requeue's
read is pulled by its part two (:meth:`SQLTopLevelQueue.flush_pulls`). The clock is read
before a write begins: a steady clock's exchange with the store would wait for that lock.

Not yet here (refused): resharding, local work items.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from quickzones.clock import Clock, now_ms
from quickzones.errors import UnsupportedByStore, ZoneLeaseFailed
from quickzones.store.ids import IdSource
from quickzones.store.keys import KeySpace
from quickzones.store.kv import (
    OWN_STORE,
    UNCOMMITTED,
    KVError,
    KVStore,
    KVTransaction,
    _Uncommitted,
)
from quickzones.store.records import Pointer, ZoneId
from quickzones.store.sql.connections import SQLConnections, SQLTransaction, retrying
from quickzones.store.sql.statements import Statements, pull_rows
from quickzones.store.toplevel import IndexEntry, PointerRef, TopLevelQueue, lease_of
from quickzones.store.tuple_layer import fdbtuple

T = TypeVar("T")

# Zones one statement of part twos pulls at most (:meth:`SQLTopLevelQueue.flush_pulls`),
# and its tries where it fails retryably.
PULLS_PER_STATEMENT = 200
PULL_TRIES = 3
# How long a pointer whose collection an application's enqueue refused waits for the next
# visit at least (its part two pulls it to the item after the COMMIT): no visits in a loop
# while that transaction is open.
HELD_POINTER_MS = 1_000
# The scan's floor (PostgreSQL's row versions): every update of a pointer leaves its old
# version's entry in the (shard, vesting) index at the old vesting time, in the past, and
# while a long transaction holds a snapshot none of them is vacuumed: a scan that read the
# shard from its start walked all of them (49 % of the server's busy time, 4.6 ms a scan,
# after 120 s of a held snapshot at 500 items/s). So a pointer is never written vesting
# earlier than this long before its writer's clock (it vests now all the same), and a
# scan starts from the earliest live pointer the last one saw, or its own time if
# earlier, less this: every pointer written since is at or above it (clocks of writers
# may lag the scanner's by up to this much).
FLOOR_SKEW_MS = 2_000
# A scan reads the shard from its start at least this often: a pointer below the floor
# (one made inside an application's REPEATABLE READ or SERIALIZABLE transaction that
# stayed open past FLOOR_SKEW_MS, a writer's clock further behind) is found by then.
FULL_SCAN_MS = 5_000
# A peek's upper bound when it looks as far ahead as there are pointers (vesting times
# are 64-bit in the table).
UNBOUNDED_MS = 2**62
_log = logging.getLogger("quick.enqueue")


@functools.lru_cache(maxsize=4096)
def zone_key(zone: ZoneId) -> bytes:
    """A zone as the tables key it: (app, tenant) packed by the tuple layer (the busy
    zones' packed once: an enqueue's statements name its zone twice, every call)."""
    packed: bytes = fdbtuple.pack((zone.app, zone.tenant))
    return packed


def zone_of(key: bytes) -> ZoneId:
    app, tenant = fdbtuple.unpack(bytes(key))
    return ZoneId(str(app), str(tenant))


def _pointer(row: Any) -> Pointer:
    zone, _shard, vesting, last_active, lease_id, holder, pointer_id = row
    return Pointer(str(pointer_id), zone_of(zone), vesting, last_active, lease_id, holder=holder)


def _app_range(app: str) -> tuple[bytes, bytes]:
    prefix = fdbtuple.pack((app,))
    return prefix, prefix[:-1] + b"\x01"  # every (app, tenant) packs to prefix + tenant


class SQLTopLevelQueue(TopLevelQueue):
    """Pointers of one cluster in the native SQL pointer table."""

    # Resharding moves KV pointers only: on this queue it would change the layout and
    # leave these pointers in shards no consumer polls any more. Refused instead.
    reshards = False

    def __init__(
        self,
        kv: KVStore,
        sql: SQLConnections,
        statements: Statements,
        *,
        keys: KeySpace | None = None,
        cluster: str = "default",
        clock: Clock | None = None,
        ids: IdSource | None = None,
    ) -> None:
        super().__init__(kv, keys=keys, cluster=cluster, clock=clock, ids=ids)
        self.sql = sql
        self.q = statements
        # Part twos of applications' enqueues whose COMMITs were seen, by zone: the
        # earliest vesting time each pointer must be pulled to (:meth:`pull_later`).
        self._pulls: dict[bytes, int] = {}
        self._pulls_lock = threading.Lock()
        # By shard: where its scans start (FLOOR_SKEW_MS), and when one last read it all.
        self._floors: dict[int, tuple[int, int]] = {}

    # --- the enqueue's pointer half (run by SQLZoneStore's enqueue statement) ----------------

    def pointer_args(self, zone: ZoneId, vesting_ms: int, now: int) -> dict[str, Any]:
        """The parameters of :meth:`upsert` for an item of ``zone`` vesting at
        ``vesting_ms`` (a new pointer's id drawn whether or not one is made)."""
        return {
            "cluster": self.cluster,
            "zone": zone_key(zone),
            "pointer_id": self.ids(8),
            "shard": self.shard_for(zone),
            "vesting_ms": max(vesting_ms, now - FLOOR_SKEW_MS),
            "now": now,
        }

    def make(self, c: Any, args: Mapping[str, Any]) -> bool:
        """Make the zone's pointer (:meth:`pointer_args`) where it has none, on ``c`` in
        its transaction: whether it did."""
        made = None
        for statement in self.q.make_pointer:
            made = c.execute(statement, args)
        return made is not None and made.fetchone() is not None

    def upsert(self, c: Any, args: Mapping[str, Any]) -> bool:
        """The enqueue's pointer half on ``c``, in its transaction: the zone's pointer
        made, or pulled to the item where it vests later and nobody leases it; whether
        either happened (consumers elsewhere may sleep past it)."""
        if self.make(c, args):
            return True
        if self.q.lock_zone_pointer is not None:
            c.execute(self.q.lock_zone_pointer, args)  # the pull's snapshot then holds it
        return c.execute(self.q.pull_pointer, args).fetchone() is not None

    def upsert_alone(self, args: Mapping[str, Any]) -> None:
        """:meth:`upsert` in a transaction of its own: an enqueue's statement whose pull
        met a version newer than its snapshot, or a pointer collected meanwhile."""

        def again() -> None:
            with self.sql.sql_write() as c:
                if self.upsert(c, args):
                    self.sql.signal_commit(c)

        retrying(self.kv, again)

    def pull_pointer_earlier(
        self,
        zone: ZoneId,
        vesting_ms: int,
        *,
        tr: KVTransaction | None = None,
        found: IndexEntry | None = None,
        active_ms: int | None = None,
        after_own_commit: Mapping[bytes, bytes | None] | None = None,
    ) -> None:
        """Move the zone's idle pointer's vesting time to ``vesting_ms`` if it vests
        later (a leased one is left to its holder's requeue)."""
        now = now_ms(self.clock) if active_ms is None else active_ms
        self._pull({zone_key(zone): vesting_ms}, now)

    def park_pointer(self, zone: ZoneId, now: int, vesting_ms: int) -> None:
        """Make the zone's pointer where it has none, vesting at ``vesting_ms``, in a
        transaction of its own: an application's enqueue that found no pointer to lock
        (:meth:`make`). Made inside the application's transaction, its row
        would stay locked until that COMMIT and every other enqueuer of the zone would
        wait for it (issue 42 point 1). It vests later than the item, which nobody can
        see yet: part two pulls it after the COMMIT."""
        args = self.pointer_args(zone, vesting_ms, now)

        def park() -> None:
            with self.sql.sql_write() as c:
                self.make(c, args)

        retrying(self.kv, park)

    def pull_later(self, zone: ZoneId, vesting_ms: int) -> None:
        """Part two of an application's enqueue whose COMMIT was seen: the zone's idle
        pointer is to vest by ``vesting_ms``. Kept until :meth:`flush_pulls`, which pulls
        every zone's so kept in one statement."""
        key = zone_key(zone)
        with self._pulls_lock:
            was = self._pulls.get(key)
            if was is None or vesting_ms < was:
                self._pulls[key] = vesting_ms

    def flush_pulls(self) -> None:
        """Pull the pointers :meth:`pull_later` kept, each to its earliest time where it
        vests later and nobody leases it (a leased one is its holder's to requeue, and
        its requeue reads the zone after this COMMIT). Waits for a commit in flight on a
        pointer (a visit's requeue) and then reads what it wrote: a pointer requeued
        past the item meanwhile is pulled back."""
        with self._pulls_lock:
            pulls, self._pulls = self._pulls, {}
        if not pulls:
            return
        self._pull(pulls, now_ms(self.clock))

    def _pull(self, pulls: Mapping[bytes, int], now: int) -> None:
        """Pull each zone's pointer of ``pulls`` (packed zone: vesting time) to its time
        where it vests later and nobody leases it (``statements.pull_rows``), a
        statement per :data:`PULLS_PER_STATEMENT` zones; commits that moved one wake idle
        consumers elsewhere. Best effort, as part two is everywhere: what fails is
        logged, and each pointer vests when it was to."""
        ordered = sorted(pulls.items())
        for at in range(0, len(ordered), PULLS_PER_STATEMENT):
            chunk = ordered[at : at + PULLS_PER_STATEMENT]
            args: dict[str, Any] = {"cluster": self.cluster, "now": now}
            for k, (zone, vesting_ms) in enumerate(chunk):
                args[f"z{k}"], args[f"v{k}"] = zone, max(vesting_ms, now - FLOOR_SKEW_MS)
            statements = pull_rows(self.q.pointers_table, self.q.dialect, len(chunk))
            for attempt in range(1, PULL_TRIES + 1):
                try:
                    with self.sql.sql_write() as c:
                        # Best effort: a crash of the server before the log's flush leaves
                        # each pointer vesting when it was to, as a lost part two does.
                        self.sql.relax_durability(c)
                        for statement in statements:
                            pulled = c.execute(statement, args)
                        if pulled.fetchone() is not None:
                            self.sql.signal_commit(c)  # consumers elsewhere may sleep past it
                    break
                except KVError as err:
                    if not err.retryable or attempt == PULL_TRIES:
                        _log.warning("pulling %d zones' pointers failed: %s", len(chunk), err)
                        break

    # --- the scan ----------------------------------------------------------------------

    def peek(
        self,
        shard: int,
        max_pointers: int,
        *,
        horizon_ms: int = 0,
        start: PointerRef | None = None,
        ahead_ms: int | None = None,
    ) -> tuple[list[PointerRef], int | None]:
        """:meth:`TopLevelQueue.peek`, one statement (:meth:`peek_statement`). The scan's
        range is bounded below by the shard's floor (``FLOOR_SKEW_MS``) and above by
        ``ahead_ms``: beside a report's snapshot, each visit's requeue and each
        enqueue's pull leaves its pointer's old version in the vesting index where it
        vested before (a leased pointer's lease end, a pointer whose items run vesting at
        their leases' end, up to 30 s ahead), none of them vacuumed. A read to the
        ``max_pointers + 1``-th pointer (most ahead of now where few are vested) fetched
        each of those rows (2,813 buffers a scan, 100 scans a second, in the hold of
        ``python -m bench.pg_long_txn``); to the consumer's longest sleep past the horizon,
        879."""
        sql, args, floor = self.peek_statement(
            shard, max_pointers, horizon_ms=horizon_ms, start=start, ahead_ms=ahead_ms
        )
        clock = args.pop("clock")
        now = clock + horizon_ms
        with self.sql.sql_read() as c:
            rows = c.execute(sql, args).fetchall()
        if start is None:
            earliest = min(rows[0][1], clock) if rows else clock
            self._floors[shard] = (earliest - FLOOR_SKEW_MS, clock if floor is None else floor[1])
        out: list[PointerRef] = []
        for pointer_id, vesting in rows:
            if vesting > now:
                return out, vesting
            if len(out) == max_pointers:
                break
            out.append(PointerRef(shard, pointer_id, vesting, self.cluster))
        return out, None

    def peek_statement(
        self,
        shard: int,
        max_pointers: int,
        *,
        horizon_ms: int = 0,
        start: PointerRef | None = None,
        ahead_ms: int | None = None,
    ) -> tuple[str, dict[str, Any], tuple[int, int] | None]:
        """The statement :meth:`peek` runs now and its parameters (with ``clock``, the
        clock it read, to be taken out), and the shard's floor it starts from (None: from
        the shard's start)."""
        clock = now_ms(self.clock)
        now = clock + horizon_ms
        until = UNBOUNDED_MS if ahead_ms is None else now + ahead_ms
        args: dict[str, Any] = {
            "cluster": self.cluster,
            "shard": shard,
            "n": max_pointers + 1,
            "until": until,
            "clock": clock,
        }
        sql = self.q.peek
        floor = None
        if start is not None:
            sql = self.q.peek_from
            args.update(vesting_ms=start.vesting_ms, pointer_id=start.pointer_id)
        else:
            kept = self._floors.get(shard)
            if kept is not None and clock - kept[1] < FULL_SCAN_MS:
                floor = kept
                sql = self.q.peek_from
                args.update(vesting_ms=kept[0], pointer_id="")
        return sql, args, floor

    def vested_zones(
        self, shard: int, window: int, *, after: PointerRef | None = None
    ) -> list[tuple[PointerRef, ZoneId]]:
        found: list[tuple[PointerRef, ZoneId]] = []
        for pointer in self._page_of_shard(shard, window, after, vested_by=now_ms(self.clock)):
            ref = PointerRef(shard, pointer.pointer_id, pointer.vesting_ms, self.cluster)
            self._zones_of[(shard, pointer.pointer_id)] = pointer.zone
            found.append((ref, pointer.zone))
        if len(self._zones_of) >= 100_000:
            self._zones_of.clear()
        return found

    def _page_of_shard(
        self, shard: int, limit: int, after: PointerRef | None, *, vested_by: int | None = None
    ) -> list[Pointer]:
        args: dict[str, Any] = {
            "cluster": self.cluster,
            "shard": shard,
            "n": self.q.no_limit if limit <= 0 else limit + (0 if after is None else 1),
        }
        sql = self.q.pointers_of_shard
        if after is not None:
            sql = self.q.pointers_of_shard_from
            args.update(vesting_ms=after.vesting_ms, pointer_id=after.pointer_id)
        with self.sql.sql_read() as c:
            rows = c.execute(sql, args).fetchall()
        pointers = [_pointer(row) for row in rows]
        if after is not None:
            pointers = [p for p in pointers if p.pointer_id != after.pointer_id]
        if vested_by is not None:
            pointers = [p for p in pointers if p.vesting_ms <= vested_by]
        return pointers[:limit] if limit > 0 else pointers

    # --- Algorithm 2's pointer lease and requeue ---------------------------------------

    def obtain_pointer_lease(
        self,
        ref: PointerRef,
        lease_ms: int,
        *,
        accept: Callable[[PointerRef, ZoneId], bool] | None = None,
        horizon_ms: int = 0,
        holder: str | None = None,
    ) -> Pointer:
        now = now_ms(self.clock)
        key = {"cluster": self.cluster, "pointer_id": ref.pointer_id}
        with self.sql.sql_read() as c:
            row = c.execute(self.q.pointer_by_id, key).fetchone()
        if row is None:
            raise ZoneLeaseFailed("gone")
        pointer = _pointer(row)
        leased = lease_of(
            pointer, ref, now, lease_ms, self.ids, accept=accept, horizon_ms=horizon_ms,
            holder=holder,
        )  # fmt: skip
        # Written where the row is as read: another consumer's lease, a requeue or an
        # enqueue's pull in between is this lease's conflict, as on the KV queue.
        with self.sql.sql_write_one() as c:
            done = c.execute(
                self.q.lease_pointer,
                {**key, "vesting_ms": leased.vesting_ms, "lease_id": leased.lease_id,
                 "holder": holder, "was_vesting_ms": pointer.vesting_ms,
                 "was_lease_id": pointer.lease_id},
            )  # fmt: skip
            if not done.rowcount:
                raise ZoneLeaseFailed("conflict")
        return leased

    def run_visit(self, visit: Callable[[KVTransaction], T]) -> T | _Uncommitted:
        """A one-transaction visit in one native write transaction (SQLite: under the
        file's write lock; PostgreSQL: its pointers locked as it leases them); UNCOMMITTED
        where it failed retryably (a deadlock or a serialization failure)."""
        try:
            with self.sql.sql_write() as c:
                inside = SQLTransaction(c, self.sql)
                done = visit(cast(KVTransaction, inside))
        except KVError as err:
            if err.retryable:
                return UNCOMMITTED
            raise
        inside.committed()
        return done

    def send_lease_read(self, ref: PointerRef, tr: KVTransaction) -> bool:
        """Send the read :meth:`lease_pointer` makes of ``ref`` in ``tr`` now, where
        ``tr`` sends statements later (its answer is read when the lease asks for it);
        whether it did."""
        if not isinstance(tr, SQLTransaction) or not tr.sends_later():
            return False
        key = {"cluster": self.cluster, "pointer_id": ref.pointer_id}
        tr.ahead[("pointer", ref.pointer_id)] = tr.conn.execute(self.q.pointer_by_id_for_visit, key)
        return True

    def lease_pointer(
        self,
        ref: PointerRef,
        lease_ms: int,
        *,
        accept: Callable[[PointerRef, ZoneId], bool] | None = None,
        horizon_ms: int = 0,
        holder: str | None = None,
        tr: KVTransaction,
    ) -> tuple[Pointer, Pointer]:
        """The pointer lease inside a visit's transaction (:meth:`run_visit`): the pointer
        read and locked for the transaction, checked, and written by nothing here: the
        requeue in the same transaction writes it once (nobody else can see it leased)."""
        c = _conn(tr)
        now = now_ms(self.clock)
        sent = cast(SQLTransaction, tr).ahead.pop(("pointer", ref.pointer_id), None)
        key = {"cluster": self.cluster, "pointer_id": ref.pointer_id}
        row = (sent or c.execute(self.q.pointer_by_id_for_visit, key)).fetchone()
        if row is None:
            raise ZoneLeaseFailed("gone")  # or held by another visit or an enqueue: later
        pointer = _pointer(row)
        leased = lease_of(
            pointer, ref, now, lease_ms, self.ids, accept=accept, horizon_ms=horizon_ms,
            holder=holder,
        )  # fmt: skip
        return pointer, leased

    def requeue_pointer(
        self,
        pointer: Pointer,
        zone_min_vesting: Callable[[KVTransaction], int | None],
        zone_is_empty: Callable[[KVTransaction], bool],
        *,
        min_inactive_ms: int,
        active: bool,
        stored: tuple[int, Pointer] | None = None,
        tr: KVTransaction = OWN_STORE,
        vests: Callable[[int], None] | None = None,
    ) -> str:
        """Release a leased pointer at the zone's next vesting time, or delete it when the
        zone has been empty ``min_inactive_ms`` (paper Algorithm 2 and pointer collection),
        in one write transaction: no enqueue commits between the zone's read and the
        pointer's write. Returns "requeued", "deleted" or "lost"."""
        now = now_ms(self.clock)
        key = {"cluster": self.cluster, "pointer_id": pointer.pointer_id}
        if tr is not OWN_STORE:  # a one-transaction visit's, which leased it (stored)
            c = _conn(tr)
            if stored is None:
                row = c.execute(self.q.pointer_by_id_locked, key).fetchone()
                if row is None or _pointer(row).lease_id != pointer.lease_id:
                    return "lost"
                current = _pointer(row)
            else:
                current = stored[1]
            return self._requeue(
                c, tr, key, current, now, zone_min_vesting, zone_is_empty,
                min_inactive_ms=min_inactive_ms, active=active, vests=vests,
            )  # fmt: skip
        with self.sql.sql_write() as c:
            row = c.execute(self.q.pointer_by_id_locked, key).fetchone()
            if row is None:
                return "lost"
            current = _pointer(row)
            if current.lease_id != pointer.lease_id:
                return "lost"
            # The zone store reads through this transaction (SQLZoneStore.min_vesting_ms).
            inside = cast(KVTransaction, SQLTransaction(c, self.sql))
            return self._requeue(
                c, inside, key, current, now, zone_min_vesting, zone_is_empty,
                min_inactive_ms=min_inactive_ms, active=active, vests=vests,
            )  # fmt: skip

    def _requeue(
        self,
        c: Any,
        inside: KVTransaction,
        key: dict[str, Any],
        current: Pointer,
        now: int,
        zone_min_vesting: Callable[[KVTransaction], int | None],
        zone_is_empty: Callable[[KVTransaction], bool],
        *,
        min_inactive_ms: int,
        active: bool,
        vests: Callable[[int], None] | None,
    ) -> str:
        """The requeue's reads and its one write, on ``c``, whose transaction holds the
        pointer (locked, or under SQLite's write lock)."""
        min_vesting = zone_min_vesting(inside)
        seen = active or min_vesting is not None
        last_active = now if seen else current.last_active_ms
        if min_vesting is None:
            if now - last_active >= min_inactive_ms:
                # Locked for the deletion first, then the zone read in a snapshot after
                # the lock. Refused where an application's enqueue into the zone holds
                # it (FOR KEY SHARE) until its COMMIT: kept, to vest after another
                # while, by when that enqueue's part two has pulled it to its item.
                zone = {"cluster": self.cluster, "zone": zone_key(current.zone)}
                if c.execute(self.q.pointer_for_delete, zone).fetchone() is None:
                    vesting = now + max(min_inactive_ms, HELD_POINTER_MS)
                elif zone_is_empty(inside):
                    c.execute(self.q.delete_pointer, key)
                    c.execute(self.q.delete_zone, zone)
                    return "deleted"
                else:
                    vesting = last_active + min_inactive_ms
            else:
                vesting = last_active + min_inactive_ms
        else:
            # Never before now (invariant 10, as the KV queue's requeue).
            vesting = max(min_vesting, now)
        c.execute(
            self.q.requeue_pointer,
            {**key, "vesting_ms": vesting, "last_active_ms": last_active},
        )
        if vests is not None:
            vests(vesting)
        return "requeued"

    def extend_pointer_lease(self, pointer: Pointer, lease_ms: int) -> Pointer | None:
        vesting = now_ms(self.clock) + lease_ms
        with self.sql.sql_write_one() as c:
            cur = c.execute(
                self.q.extend_pointer,
                {"cluster": self.cluster, "pointer_id": pointer.pointer_id,
                 "lease_id": pointer.lease_id, "vesting_ms": vesting},
            )  # fmt: skip
            changed = cur.rowcount
        return pointer.with_vesting(vesting) if changed else None

    def drop_pointer_if_empty(
        self, zone: ZoneId, zone_is_empty: Callable[[KVTransaction], bool]
    ) -> bool:
        key = {"cluster": self.cluster, "zone": zone_key(zone)}
        with self.sql.sql_write() as c:
            # The registry row first (an application's open enqueue into the zone holds
            # it FOR KEY SHARE: waited for, its item is then seen), then the pointer.
            if c.execute(self.q.pointer_for_drop, key).fetchone() is None:
                return True
            row = c.execute(self.q.pointer_of_zone_locked, key).fetchone()
            if row is None:
                return True
            if not zone_is_empty(cast(KVTransaction, SQLTransaction(c))):
                return False
            c.execute(self.q.delete_pointer, {"cluster": self.cluster, "pointer_id": row[6]})
            c.execute(self.q.delete_zone, key)
        return True

    # --- reads -------------------------------------------------------------------------

    def get_pointer(self, zone: ZoneId, *, tr: KVTransaction = OWN_STORE) -> Pointer | None:
        with self.sql.sql_read() as c:
            row = c.execute(
                self.q.pointer_of_zone, {"cluster": self.cluster, "zone": zone_key(zone)}
            ).fetchone()
        return None if row is None else _pointer(row)

    def list_pointers(self, shard: int, limit: int = 0) -> list[Pointer]:
        return self._page_of_shard(shard, limit, None)

    def count_pointers(self, shard: int) -> int:
        with self.sql.sql_read() as c:
            args = {"cluster": self.cluster, "shard": shard}
            return int(c.execute(self.q.count_pointers, args).fetchone()[0])

    def apps(self) -> set[str]:
        apps: set[str] = set()
        begin = b""
        while True:
            with self.sql.sql_read() as c:
                row = c.execute(
                    self.q.first_zone_after, {"cluster": self.cluster, "begin": begin}
                ).fetchone()
            if row is None:
                return apps
            app = zone_of(row[0]).app
            apps.add(app)
            begin = _app_range(app)[1]  # past the app's tenants in one hop

    def zone_page(
        self,
        app: str,
        limit: int,
        *,
        after: bytes | None = None,
        contains: str | None = None,
        prefix: str | None = None,
        skip: int = 1000,
    ) -> tuple[list[str], bytes | None]:
        begin, end = _app_range(app)
        if prefix is not None:
            begin = fdbtuple.pack((app, prefix))[:-1]  # the tenants that start with it
            end = begin + b"\xff"
        if after is not None:
            begin = max(begin, after + b"\x00")
        tenants: list[str] = []
        passed = 0
        with self.sql.sql_read() as c:
            rows = c.execute(
                self.q.zones_from,
                {"cluster": self.cluster, "begin": begin, "end": end, "n": limit + 1 + skip},
            ).fetchall()
        for row in rows:
            tenant = zone_of(row[0]).tenant
            if contains is not None and contains not in tenant:
                passed += 1
                if passed > skip:
                    return tenants, bytes(row[0])
                continue
            if len(tenants) == limit:
                return tenants, zone_key(ZoneId(app, tenants[-1]))
            tenants.append(tenant)
        return tenants, None

    def zone_count(self, app: str, max_keys: int) -> tuple[int, bool]:
        begin, end = _app_range(app)
        with self.sql.sql_read() as c:
            n = int(
                c.execute(
                    self.q.count_zones,
                    {"cluster": self.cluster, "begin": begin, "end": end, "n": max_keys + 1},
                ).fetchone()[0]
            )
        return (max_keys, False) if n > max_keys else (n, True)

    def vested_zone_page(
        self, app: str, now_ms: int, limit: int, *, after: bytes | None = None, skip: int = 500
    ) -> tuple[list[str], bytes | None]:
        begin, end = _app_range(app)
        vesting, pointer_id = (-1, "") if after is None else fdbtuple.unpack(after)
        with self.sql.sql_read() as c:
            rows = c.execute(
                self.q.vested_zones_of_app,
                {"cluster": self.cluster, "begin": begin, "end": end, "now": now_ms,
                 "vesting_ms": vesting, "pointer_id": pointer_id, "n": limit + 1},
            ).fetchall()  # fmt: skip
        tenants = [zone_of(zone).tenant for zone, _, _ in rows[:limit]]
        if len(rows) <= limit:
            return tenants, None
        _, last_vesting, last_id = rows[limit - 1]
        return tenants, fdbtuple.pack((last_vesting, last_id))

    # --- not yet native --------------------------------------------------------------------

    def move_pointer(
        self, zone: ZoneId, src: int, dst: int, *, tr: KVTransaction = OWN_STORE
    ) -> int:
        raise _unsupported("resharding")


def _conn(tr: KVTransaction) -> Any:
    """The connection of a native transaction handed in as ``tr``."""
    if not isinstance(tr, SQLTransaction):
        raise _unsupported("a pointer operation inside a KV transaction")
    return tr.conn


def _unsupported(what: str) -> UnsupportedByStore:
    return UnsupportedByStore(
        what, "zones=sql", "SQLTopLevelQueue", "not built for zones=sql yet (issue 44)"
    )

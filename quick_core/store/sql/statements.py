"""The native SQL zones' tables and statements (docs/backends.md, "Zones native in SQL").

Written once, in SQLite's dialect with named parameters (``:zone``); :func:`statements`
makes a store's set, its tables named after the key space's root (so two roots in one
database stay apart) in the store's namespace, and derives PostgreSQL's (``%(zone)s``,
``bytea``, ``bigint``, ``greatest``, ``IS NOT DISTINCT FROM``). SQLite runs every write
under ``BEGIN IMMEDIATE``: one writer at a time, so no statement needs a row lock, and the
``FOR UPDATE`` of the statements that lock a pointer is PostgreSQL's alone.

``zone`` is the zone's (app, tenant) packed by the tuple layer, as the KV zones' keys pack
it: zones sort by app, then tenant, and one app's zones share a prefix.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from quickzones.errors import ConfigurationError

_ROOT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
# A pointer's vesting time where a write compares it, kept out of the (cluster, shard,
# vesting_ms) index's reach: PostgreSQL costed a range of it as a row or two and chose
# that index over the pointer's own key, then walked every dead entry past now that a
# held snapshot keeps (5,300 buffers a pull).
UNINDEXED_VESTING = "vesting_ms + 0"
# A new pointer's first version (PostgreSQL's statements written here say the same:
# %(now)s * 1024): above every version of the zone's earlier pointers
# (collected, their rows dead but kept under a held snapshot), which the newest-first
# read would otherwise walk before it. Its maker's clock in ms times 1,024: a pointer
# would need more than 1,024 writes a millisecond to overtake its successor's.
FIRST_VERSION = ":now * 1024"


@dataclass(frozen=True, slots=True)
class Statements:
    """One store's tables and statements."""

    schema: tuple[str, ...]
    dialect: str
    items_table: str
    pointers_table: str
    # One row a zone that has a pointer: the zone's uniqueness, and the row an
    # application's enqueue shares and a collection locks (written only when a pointer
    # is made or deleted).
    zones_table: str
    # Whether the pointers table exists (:table names it): a store opened without zones=sql.
    table_exists: str
    # A store whose pointers table is of the layout before pointer versions (one row a
    # zone, unique): the table renamed out of the way before :attr:`schema` runs, then
    # its rows copied into the new tables (each pointer its registry row and version 0)
    # and the old table dropped, in the one schema transaction.
    migrate_rename: str
    migrate_copy: tuple[str, ...]
    # A LIMIT that bounds nothing.
    no_limit: int | None
    # --- items -----------------------------------------------------------------------------
    # An item's row; nothing when its id is in the zone already (an idempotent repeat).
    insert_item: str
    # The zone's pointer made where it has none (its registry row, then its first
    # version), in one transaction: the last statement returns a row where it was made.
    # PostgreSQL's is one statement (a data-modifying WITH).
    make_pointer: tuple[str, ...]
    # The zone's pointer pulled to :vesting_ms where it vests later and nobody leases it
    # (a row where it was), its newest version found first. On PostgreSQL
    # :attr:`lock_zone_pointer` runs before it in the same transaction, so this
    # statement's own snapshot holds the version it must write.
    pull_pointer: str
    # The zone's newest pointer version locked for a pull (PostgreSQL); None on SQLite,
    # whose write lock is the whole file's.
    lock_zone_pointer: str | None
    # The item's row, returning a row when it wrote (a transaction's statements are
    # pipelined on PostgreSQL: their results are read from rows, never a row count).
    insert_item_returning: str
    # Both parts in one statement, which says whether it wrote the item, whether it made
    # or pulled the pointer, and whether the pull must be tried again in a transaction of
    # its own (the pointer changed by a commit after the statement's snapshot, or was
    # collected meanwhile: PostgreSQL's data-modifying WITH, one round trip an enqueue);
    # None where the dialect has none (SQLite runs the parts under its write lock).
    enqueue_one: str | None
    # Part one in an application's transaction (``Quick.enqueue_on``): the item's row and
    # the zone's registry row locked FOR KEY SHARE (a share no other enqueuer of the
    # zone, and no consumer's lease or requeue, waits for; only the pointer's collection
    # does), returning whether it wrote the item, whether a pointer was there to lock,
    # and the transaction's id; None where the dialect has no row locks (SQLite: the
    # file's).
    enqueue_shared: str | None
    # The zone's registry row locked FOR KEY SHARE (a row when there is one).
    share_pointer: str
    item: str
    items_of_zone: str
    # Vested items in the zone's order (priority, vesting time, enqueue order), at most n.
    vested: str
    # A dequeue's one read (one round trip), of the items the zone's floor admits
    # (item_floors.py: :f_low, :p0, :v0, :f_high): rows of part 0, the vested items in order (at
    # most :n + 1: one more says a vested item is left); part 1, where those leave room,
    # the unleased items vesting after :now and by :upto, in order; part 2, one row, where
    # part 0 read every vested item and part 1 read none, the earliest vesting time after
    # :now of the zone's items (a loose index scan, as min_vesting), so that the requeue
    # of the same visit reads the zone no more. Columns: part, id, record, vesting_ms.
    dequeue_read: str
    # An item's new state, written only where its row still holds the record read.
    update_item: str
    delete_item: str
    delete_leased_item: str
    # An item's row deleted only where it still holds the record read (a dead letter's).
    delete_item_if: str
    # The zone's next vesting time: the first entry of each priority (a loose index scan),
    # never a scan of the zone's items.
    min_vesting: str
    any_item: str
    count: str
    # --- pointers --------------------------------------------------------------------------
    # A pointer's newest version: each write of a pointer is a new version of its row
    # (``version`` one more), found first by the (pointer_id, cluster, version) and
    # (zone, cluster, version) indexes, which are not unique: under a snapshot a report
    # holds open, PostgreSQL keeps every version, and a unique index checked each of
    # them at every write (docs/backends.md, "Beside long transactions").
    pointer_by_id: str
    pointer_of_zone: str
    # The same, the row locked until the transaction ends (PostgreSQL): a requeue or a
    # collection that reads the zone after it cannot miss an enqueue's item (the enqueue's
    # pull of the pointer waits for the lock, or holds it first).
    pointer_by_id_locked: str
    pointer_of_zone_locked: str
    # A one-transaction visit's pointer, locked, or no row where another transaction
    # holds it (PostgreSQL's SKIP LOCKED: two visits of several zones each never wait
    # for each other's pointers, so never in a cycle).
    pointer_by_id_for_visit: str
    # The zone's registry row locked for the pointer's deletion, or no row where another
    # transaction holds it (an enqueue's FOR KEY SHARE: its zone is getting an item, so it
    # is not collected).
    pointer_for_delete: str
    # The same, waiting for the lock (an explicit collection of one zone).
    pointer_for_drop: str
    lease_pointer: str
    requeue_pointer: str
    extend_pointer: str
    # A pointer's deletion: its newest version, then its zone's registry row (run
    # both, in one transaction).
    delete_pointer: str
    delete_zone: str
    peek: str
    peek_from: str
    pointers_of_shard: str
    pointers_of_shard_from: str
    count_pointers: str
    zones_from: str
    count_zones: str
    first_zone_after: str
    vested_zones_of_app: str


def statements(root: str, dialect: str = "sqlite", namespace: str = "") -> Statements:
    """The statements of the key space ``root`` (its tables ``<root>_items``,
    ``<root>_pointers`` and ``<root>_zones`` in ``namespace``, a quoted schema and a dot
    or nothing) in ``dialect``, "sqlite" or "postgres"."""
    if dialect not in ("sqlite", "postgres"):
        raise ConfigurationError(f"zones=sql speaks sqlite and postgres, not {dialect!r}")
    made = _sqlite(root, namespace)
    if dialect == "sqlite":
        return made
    derived: dict[str, Any] = {f.name: _postgres(getattr(made, f.name)) for f in fields(made)}
    pg = Statements(**derived)
    p, z = made.pointers_table, made.zones_table
    # The pointer made where the zone has none: its registry row and its first version
    # in one statement (a registry row is never without its pointer).
    make_one = (
        f"WITH made AS (INSERT INTO {z} (cluster, zone, pointer_id, shard)"
        " VALUES (%(cluster)s, %(zone)s, %(pointer_id)s, %(shard)s)"
        " ON CONFLICT (cluster, zone) DO NOTHING RETURNING 1)"
        f" INSERT INTO {p} (cluster, zone, pointer_id, shard, vesting_ms, last_active_ms,"
        " version) SELECT %(cluster)s, %(zone)s, %(pointer_id)s, %(shard)s, %(vesting_ms)s,"
        " %(now)s, %(now)s * 1024 FROM made RETURNING 1"
    )
    # An enqueue's both parts in one statement. The pull locks the zone's newest
    # version and writes that version: where it is newer than the statement's snapshot
    # (a commit in between) the write finds nothing, and the statement says so (third
    # column), as it does where the pointer was collected meanwhile; the caller then
    # pulls again in a transaction of its own.
    enqueue_one = (
        f"WITH item AS ({pg.insert_item} RETURNING 1),"
        f" made AS (INSERT INTO {z} (cluster, zone, pointer_id, shard)"
        " VALUES (%(cluster)s, %(zone)s, %(pointer_id)s, %(shard)s)"
        " ON CONFLICT (cluster, zone) DO NOTHING RETURNING 1),"
        f" made_row AS (INSERT INTO {p} (cluster, zone, pointer_id, shard, vesting_ms,"
        " last_active_ms, version) SELECT %(cluster)s, %(zone)s, %(pointer_id)s, %(shard)s,"
        " %(vesting_ms)s, %(now)s, %(now)s * 1024 FROM made RETURNING 1),"
        f" cur AS (SELECT pointer_id, version, vesting_ms, lease_id FROM {p}"
        " WHERE cluster = %(cluster)s AND zone = %(zone)s AND NOT EXISTS (SELECT 1 FROM made)"
        " ORDER BY version DESC LIMIT 1 FOR NO KEY UPDATE),"
        # The version the lock returned, by its id: a scalar each, so the row is found
        # by the (pointer_id, cluster, version) index, never by a join the planner may
        # start from the vesting index (5,000 buffers a call under a held snapshot).
        f" pulled AS (UPDATE {p} SET vesting_ms = %(vesting_ms)s, version = version + 1"
        " WHERE cluster = %(cluster)s AND pointer_id = (SELECT pointer_id FROM cur)"
        " AND version = (SELECT version FROM cur) AND EXISTS (SELECT 1 FROM cur"
        " WHERE vesting_ms > %(vesting_ms)s AND lease_id IS NULL) RETURNING 1)"
        " SELECT (SELECT count(*) FROM item),"
        " (SELECT count(*) FROM made_row) + (SELECT count(*) FROM pulled),"
        " CASE WHEN EXISTS (SELECT 1 FROM made) THEN 0"
        " WHEN NOT EXISTS (SELECT 1 FROM cur) THEN 1"
        " WHEN EXISTS (SELECT 1 FROM pulled) THEN 0"
        " WHEN EXISTS (SELECT 1 FROM cur WHERE vesting_ms > %(vesting_ms)s"
        " AND lease_id IS NULL) THEN 1 ELSE 0 END"
    )
    share_pointer = pg.share_pointer + " FOR KEY SHARE"
    # The dequeue read also says which writers its snapshot saw running (item_floors.py,
    # WriterHorizon): its oldest running transaction id and the next one, in part 3.
    order = " ORDER BY part, priority, vesting_ms, seq"
    assert pg.dequeue_read.endswith(order)
    dequeue_read = (
        pg.dequeue_read[: -len(order)]
        + " UNION ALL SELECT 3, NULL, NULL, pg_snapshot_xmin(s)::text::bigint,"
        " pg_snapshot_xmax(s)::text::bigint, NULL FROM pg_current_snapshot() AS s" + order
    )
    enqueue_shared = (
        f"WITH item AS ({pg.insert_item} RETURNING 1), held AS ({share_pointer})"
        " SELECT (SELECT count(*) FROM item), (SELECT count(*) FROM held),"
        " pg_current_xact_id()::text, current_setting('transaction_isolation')"
    )
    # Autovacuum per table (docs/backends.md, "Zones native in SQL: the design", Vacuum):
    # every lease and visit writes a new version with an indexed vesting time, so no
    # update is HOT and each leaves a dead row; vacuumed after 2 % of a large table is
    # dead rather than PostgreSQL's 20 %, the pointers (small, rewritten by every visit)
    # unthrottled.
    i = made.items_table
    tuned = (
        f"ALTER TABLE {i} SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_vacuum_threshold = 1000)",
        f"ALTER TABLE {p} SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0)",
    )
    return replace(
        pg,
        schema=pg.schema + tuned,
        dialect="postgres",
        enqueue_one=enqueue_one,
        enqueue_shared=enqueue_shared,
        dequeue_read=dequeue_read,
        share_pointer=share_pointer,
        make_pointer=(make_one,),
        lock_zone_pointer=pg.pointer_of_zone + " FOR NO KEY UPDATE",
        insert_item_returning=pg.insert_item + " RETURNING 1",
        items_table=made.items_table,
        pointers_table=made.pointers_table,
        zones_table=made.zones_table,
        # Read from pg_class in the statement's own snapshot: to_regclass reads the
        # catalog caches, which after the schema lock's wait could still miss a table
        # another process made meanwhile, and a store made at once by two processes
        # looked half made (its pointers, not its registry) and was "migrated" again.
        table_exists=(
            "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p')"
            """ AND '"' || replace(n.nspname, '"', '""') || '".' || c.relname = %(table)s"""
        ),
        # FOR NO KEY UPDATE: a lease or a requeue changes no key, so it never waits for
        # an application's transaction that enqueued into the zone (whose FOR KEY SHARE
        # is on the registry row anyway).
        pointer_by_id_locked=pg.pointer_by_id + " FOR NO KEY UPDATE",
        pointer_by_id_for_visit=pg.pointer_by_id + " FOR NO KEY UPDATE SKIP LOCKED",
        pointer_for_delete=pg.pointer_for_delete + " FOR UPDATE SKIP LOCKED",
        pointer_for_drop=pg.pointer_for_drop + " FOR UPDATE",
        pointer_of_zone_locked=pg.pointer_of_zone + " FOR UPDATE",
    )


_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z_0-9]*)")


def _postgres(made: object) -> object:
    """One of SQLite's statements (or a tuple of them, or a constant) as PostgreSQL's."""
    if isinstance(made, tuple):
        return tuple(_postgres(m) for m in made)
    if not isinstance(made, str):
        return None if made == -1 else made  # LIMIT NULL: no limit
    sql = made.replace("seq INTEGER PRIMARY KEY", "seq bigserial PRIMARY KEY")
    sql = sql.replace("BLOB", "bytea").replace("INTEGER", "bigint").replace(" WITHOUT ROWID", "")
    sql = sql.replace("max(last_active_ms,", "greatest(last_active_ms,")
    sql = sql.replace("lease_id IS :was_lease_id", "lease_id IS NOT DISTINCT FROM :was_lease_id")
    return _PARAM.sub(r"%(\1)s", sql)


def _sqlite(root: str, namespace: str) -> Statements:
    if not _ROOT.fullmatch(root):
        raise ConfigurationError(
            f"zones=sql names its tables after the key space root, which must be letters,"
            f" digits and underscores (at most 41), not {root!r}"
        )
    i, p = f"{namespace}{root}_items", f"{namespace}{root}_pointers"
    z = f"{namespace}{root}_zones"
    ii, pp = f"{root}_items", f"{root}_pointers"  # index names: in their table's schema
    cols = "zone, shard, vesting_ms, last_active_ms, lease_id, holder, pointer_id"
    by_id = (
        f"SELECT {cols} FROM {p} WHERE cluster = :cluster AND pointer_id = :pointer_id"
        " ORDER BY version DESC LIMIT 1"
    )
    of_zone = (
        f"SELECT {cols} FROM {p} WHERE cluster = :cluster AND zone = :zone"
        " ORDER BY version DESC LIMIT 1"
    )
    # The newest version of the pointer a statement names (by :pointer_id): a write
    # follows a read that locked it in the same transaction (PostgreSQL), so its own
    # snapshot holds that version; or it is conditional on what an earlier read saw, and
    # a version written since makes it write nothing (PostgreSQL rechecks this against
    # the newest version, which is not the one read).
    newest = (
        f"version = (SELECT max(version) FROM {p} AS n WHERE n.cluster = :cluster"
        " AND n.pointer_id = :pointer_id)"
    )
    insert_item = (
        f"INSERT INTO {i} (zone, id, priority, vesting_ms, lease_id, record)"
        " VALUES (:zone, :id, :priority, :vesting_ms, NULL, :record)"
        " ON CONFLICT (zone, id) DO NOTHING"
    )
    of_registry = f"SELECT 1 FROM {z} WHERE cluster = :cluster AND zone = :zone"
    return Statements(
        dialect="sqlite",
        enqueue_one=None,
        enqueue_shared=None,
        share_pointer=of_registry,
        # Under the write lock: the registry row where the zone has none, then the first
        # version where that statement wrote it.
        make_pointer=(
            f"INSERT INTO {z} (cluster, zone, pointer_id, shard)"
            " VALUES (:cluster, :zone, :pointer_id, :shard) ON CONFLICT (cluster, zone) DO NOTHING",
            f"INSERT INTO {p} (cluster, zone, pointer_id, shard, vesting_ms, last_active_ms,"
            " version) SELECT :cluster, :zone, :pointer_id, :shard, :vesting_ms, :now,"
            f" {FIRST_VERSION}"
            " WHERE changes() = 1 RETURNING 1",
        ),
        pull_pointer=(
            f"UPDATE {p} SET vesting_ms = :vesting_ms, version = version + 1"
            " WHERE cluster = :cluster AND zone = :zone AND version = (SELECT max(version)"
            f" FROM {p} AS n WHERE n.cluster = :cluster AND n.zone = :zone)"
            f" AND {UNINDEXED_VESTING} > :vesting_ms AND lease_id IS NULL RETURNING 1"
        ),
        lock_zone_pointer=None,
        pointer_for_delete=of_registry,
        pointer_for_drop=of_registry,
        insert_item_returning=insert_item + " RETURNING 1",
        items_table=i,
        pointers_table=p,
        zones_table=z,
        table_exists="SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :table",
        migrate_rename=f"ALTER TABLE {p} RENAME TO {pp}_unversioned",
        migrate_copy=(
            f"INSERT INTO {z} (cluster, zone, pointer_id, shard)"
            f" SELECT cluster, zone, pointer_id, shard FROM {namespace}{pp}_unversioned",
            f"INSERT INTO {p} (cluster, zone, pointer_id, shard, vesting_ms, last_active_ms,"
            " lease_id, holder, version) SELECT cluster, zone, pointer_id, shard, vesting_ms,"
            f" last_active_ms, lease_id, holder, 0 FROM {namespace}{pp}_unversioned",
            f"DROP TABLE {namespace}{pp}_unversioned",
        ),
        no_limit=-1,
        pointer_by_id=by_id,
        pointer_of_zone=of_zone,
        # SQLite's write lock is the whole file's, taken at BEGIN IMMEDIATE.
        pointer_by_id_locked=by_id,
        pointer_by_id_for_visit=by_id,
        pointer_of_zone_locked=of_zone,
        schema=(
            # The rowid orders items of one vesting time by their enqueue.
            f"CREATE TABLE IF NOT EXISTS {i} (seq INTEGER PRIMARY KEY, zone BLOB NOT NULL,"
            " id TEXT NOT NULL, priority INTEGER NOT NULL, vesting_ms INTEGER NOT NULL,"
            " lease_id TEXT, record BLOB NOT NULL, UNIQUE (zone, id))",
            f"CREATE INDEX IF NOT EXISTS {ii}_order ON {i} (zone, priority, vesting_ms)",
            # No unique index on the pointers' versions (above, newest): the registry
            # row is the zone's one pointer.
            f"CREATE TABLE IF NOT EXISTS {p} (cluster TEXT NOT NULL, zone BLOB NOT NULL,"
            " pointer_id TEXT NOT NULL, shard INTEGER NOT NULL, vesting_ms INTEGER NOT NULL,"
            " last_active_ms INTEGER NOT NULL, lease_id TEXT, holder TEXT,"
            " version INTEGER NOT NULL)",
            # Each index leads with the key only its own reads name (not the cluster,
            # which every statement names): PostgreSQL, planning with a small table's
            # statistics, took the vesting index for a pull by zone on the cluster alone
            # and walked all of it under a held snapshot (4,000 buffers a pull).
            f"CREATE INDEX IF NOT EXISTS {pp}_by_zone ON {p} (zone, cluster, version)",
            f"CREATE INDEX IF NOT EXISTS {pp}_by_id ON {p} (pointer_id, cluster, version)",
            f"CREATE INDEX IF NOT EXISTS {pp}_vesting ON {p}"
            " (shard, cluster, vesting_ms, pointer_id)",
            f"CREATE TABLE IF NOT EXISTS {z} (cluster TEXT NOT NULL, zone BLOB NOT NULL,"
            " pointer_id TEXT NOT NULL, shard INTEGER NOT NULL,"
            " PRIMARY KEY (cluster, zone)) WITHOUT ROWID",
        ),
        insert_item=insert_item,
        item=f"SELECT record FROM {i} WHERE zone = :zone AND id = :id",
        items_of_zone=(
            f"SELECT record FROM {i} WHERE zone = :zone ORDER BY priority, vesting_ms, seq LIMIT :n"
        ),
        vested=(
            f"SELECT id, record FROM {i} WHERE zone = :zone AND vesting_ms <= :upto"
            " ORDER BY priority, vesting_ms, seq LIMIT :n"
        ),
        update_item=(
            f"UPDATE {i} SET vesting_ms = :vesting_ms, lease_id = :lease_id, record = :record"
            " WHERE zone = :zone AND id = :id AND record = :was"
        ),
        delete_item=f"DELETE FROM {i} WHERE zone = :zone AND id = :id",
        delete_item_if=f"DELETE FROM {i} WHERE zone = :zone AND id = :id AND record = :was",
        delete_leased_item=(
            f"DELETE FROM {i} WHERE zone = :zone AND id = :id AND lease_id = :lease_id"
        ),
        min_vesting=(
            "WITH RECURSIVE firsts(priority, vesting_ms) AS ("
            f" SELECT * FROM (SELECT priority, vesting_ms FROM {i} WHERE zone = :zone"
            " ORDER BY priority, vesting_ms LIMIT 1) AS head"
            f" UNION ALL SELECT (SELECT priority FROM {i} WHERE zone = :zone"
            " AND priority > firsts.priority ORDER BY priority, vesting_ms LIMIT 1),"
            f" (SELECT vesting_ms FROM {i} WHERE zone = :zone AND priority > firsts.priority"
            " ORDER BY priority, vesting_ms LIMIT 1) FROM firsts"
            " WHERE firsts.priority IS NOT NULL)"
            " SELECT min(vesting_ms) FROM firsts"
        ),
        dequeue_read=(
            # Two index ranges (item_floors.py): the priorities before :p0 from :f_low,
            # and from (:p0, :v0) on, later priorities from :f_high (checked on the
            # index entry: an older one's row is never fetched).
            "WITH RECURSIVE v AS (SELECT id, record, priority, vesting_ms, seq FROM ("
            " SELECT * FROM (SELECT id, record, priority, vesting_ms, seq"
            f" FROM {i} WHERE zone = :zone AND priority < :p0 AND vesting_ms >= :f_low"
            " AND vesting_ms <= :now ORDER BY priority, vesting_ms, seq LIMIT :n + 1) AS lo"
            " UNION ALL SELECT * FROM (SELECT id, record, priority, vesting_ms, seq"
            f" FROM {i} WHERE zone = :zone AND (priority, vesting_ms) >= (:p0, :v0)"
            " AND vesting_ms >= :f_high AND vesting_ms <= :now"
            " ORDER BY priority, vesting_ms, seq LIMIT :n + 1) AS hi) AS both_ranges"
            " ORDER BY priority, vesting_ms, seq LIMIT :n + 1),"
            " a AS (SELECT id, record, priority, vesting_ms, seq"
            f" FROM {i} WHERE zone = :zone AND vesting_ms > :now AND vesting_ms <= :upto"
            " AND lease_id IS NULL ORDER BY priority, vesting_ms, seq"
            " LIMIT CASE WHEN (SELECT count(*) FROM v) > :n THEN 0"
            " ELSE :n - (SELECT count(*) FROM v) END),"
            # The zone's next vesting time after :now, no later than :ahead (part 2):
            # the priorities of items vesting then (past entries and those past :ahead
            # are skipped on the index alone), each one's first. Every item a visit
            # leased and completed since a report's snapshot began keeps its leased
            # version at its lease's end, up to the item lease (30 s) ahead: bounded, a
            # small zone's read walks those of :ahead - :now, not of the lease.
            " ps(priority) AS ("
            f" SELECT * FROM (SELECT priority FROM {i} WHERE zone = :zone"
            " AND vesting_ms > :now AND vesting_ms <= :ahead"
            " AND (SELECT count(*) FROM v) <= :n AND NOT EXISTS (SELECT 1 FROM a)"
            " ORDER BY priority LIMIT 1) AS head"
            f" UNION ALL SELECT (SELECT priority FROM {i} WHERE zone = :zone"
            " AND priority > ps.priority AND vesting_ms > :now AND vesting_ms <= :ahead"
            " ORDER BY priority LIMIT 1)"
            " FROM ps WHERE ps.priority IS NOT NULL),"
            f" firsts(vesting_ms) AS (SELECT (SELECT vesting_ms FROM {i} WHERE zone = :zone"
            " AND priority = ps.priority AND vesting_ms > :now AND vesting_ms <= :ahead"
            " ORDER BY vesting_ms LIMIT 1)"
            " FROM ps WHERE ps.priority IS NOT NULL),"
            # Where the zone showed nothing to take and nothing by :ahead, whether it is
            # empty (part 4): the same, unbounded.
            " ps_all(priority) AS ("
            f" SELECT * FROM (SELECT priority FROM {i} WHERE zone = :zone"
            " AND vesting_ms > :ahead AND NOT EXISTS (SELECT 1 FROM v)"
            " AND NOT EXISTS (SELECT 1 FROM a)"
            " AND NOT EXISTS (SELECT 1 FROM firsts WHERE vesting_ms IS NOT NULL)"
            " ORDER BY priority LIMIT 1) AS head"
            f" UNION ALL SELECT (SELECT priority FROM {i} WHERE zone = :zone"
            " AND priority > ps_all.priority AND vesting_ms > :ahead ORDER BY priority LIMIT 1)"
            " FROM ps_all WHERE ps_all.priority IS NOT NULL),"
            " firsts_all(vesting_ms) AS (SELECT (SELECT vesting_ms"
            f" FROM {i} WHERE zone = :zone AND priority = ps_all.priority"
            " AND vesting_ms > :ahead ORDER BY vesting_ms LIMIT 1)"
            " FROM ps_all WHERE ps_all.priority IS NOT NULL)"
            " SELECT 0 AS part, id, record, priority, vesting_ms, seq FROM v"
            " UNION ALL SELECT 1, id, record, priority, vesting_ms, seq FROM a"
            " UNION ALL SELECT 2, NULL, NULL, NULL, min(vesting_ms), NULL FROM firsts"
            " UNION ALL SELECT 4, NULL, NULL, NULL, min(vesting_ms), NULL FROM firsts_all"
            " ORDER BY part, priority, vesting_ms, seq"
        ),
        any_item=f"SELECT 1 FROM {i} WHERE zone = :zone LIMIT 1",
        count=f"SELECT count(*) FROM {i} WHERE zone = :zone",
        lease_pointer=(
            f"UPDATE {p} SET vesting_ms = :vesting_ms, lease_id = :lease_id, holder = :holder,"
            f" version = version + 1 WHERE cluster = :cluster AND pointer_id = :pointer_id"
            f" AND {newest} AND {UNINDEXED_VESTING} = :was_vesting_ms"
            " AND lease_id IS :was_lease_id"
        ),
        requeue_pointer=(
            f"UPDATE {p} SET vesting_ms = :vesting_ms, last_active_ms = :last_active_ms,"
            " lease_id = NULL, holder = NULL, version = version + 1"
            f" WHERE cluster = :cluster AND pointer_id = :pointer_id AND {newest}"
        ),
        extend_pointer=(
            f"UPDATE {p} SET vesting_ms = :vesting_ms, version = version + 1"
            f" WHERE cluster = :cluster AND pointer_id = :pointer_id AND {newest}"
            " AND lease_id = :lease_id"
        ),
        delete_pointer=(
            f"DELETE FROM {p} WHERE cluster = :cluster AND pointer_id = :pointer_id AND {newest}"
        ),
        delete_zone=f"DELETE FROM {z} WHERE cluster = :cluster AND zone = :zone",
        # Both to :until (SQLTopLevelQueue.peek): the index range ends there.
        peek=(
            f"SELECT pointer_id, vesting_ms FROM {p} WHERE cluster = :cluster AND shard = :shard"
            " AND vesting_ms <= :until ORDER BY vesting_ms, pointer_id LIMIT :n"
        ),
        peek_from=(
            f"SELECT pointer_id, vesting_ms FROM {p} WHERE cluster = :cluster AND shard = :shard"
            " AND (vesting_ms, pointer_id) >= (:vesting_ms, :pointer_id)"
            " AND vesting_ms <= :until ORDER BY vesting_ms, pointer_id LIMIT :n"
        ),
        pointers_of_shard=(
            f"SELECT zone, shard, vesting_ms, last_active_ms, lease_id, holder, pointer_id"
            f" FROM {p} WHERE cluster = :cluster AND shard = :shard"
            " ORDER BY vesting_ms, pointer_id LIMIT :n"
        ),
        pointers_of_shard_from=(
            f"SELECT zone, shard, vesting_ms, last_active_ms, lease_id, holder, pointer_id"
            f" FROM {p} WHERE cluster = :cluster AND shard = :shard"
            " AND (vesting_ms, pointer_id) >= (:vesting_ms, :pointer_id)"
            " ORDER BY vesting_ms, pointer_id LIMIT :n"
        ),
        count_pointers=f"SELECT count(*) FROM {p} WHERE cluster = :cluster AND shard = :shard",
        zones_from=(
            f"SELECT zone FROM {z} WHERE cluster = :cluster AND zone >= :begin AND zone < :end"
            " ORDER BY zone LIMIT :n"
        ),
        count_zones=(
            f"SELECT count(*) FROM (SELECT 1 FROM {z} WHERE cluster = :cluster"
            " AND zone >= :begin AND zone < :end LIMIT :n)"
        ),
        vested_zones_of_app=(
            f"SELECT zone, vesting_ms, pointer_id FROM {p} WHERE cluster = :cluster"
            " AND zone >= :begin AND zone < :end AND vesting_ms <= :now"
            " AND (vesting_ms, pointer_id) > (:vesting_ms, :pointer_id)"
            " ORDER BY vesting_ms, pointer_id LIMIT :n"
        ),
        first_zone_after=(
            f"SELECT zone FROM {z} WHERE cluster = :cluster AND zone >= :begin"
            " ORDER BY zone LIMIT 1"
        ),
    )


@functools.lru_cache(maxsize=256)
def lease_rows(items_table: str, dialect: str, n: int) -> str:
    """One statement that writes ``n`` items' leases (parameters ``:zone`` and, for each
    row k, ``:i<k>`` its id, ``:v<k>`` its vesting time, ``:l<k>`` its lease id, ``:r<k>``
    its record and ``:w<k>`` the record it must still hold), returning the ids written:
    a dequeue's leases in one round trip."""
    rows = " UNION ALL ".join(
        f"SELECT :i{k} AS id, :v{k} AS vesting_ms, :l{k} AS lease_id, :r{k} AS record, :w{k} AS was"
        for k in range(n)
    )
    sql = (
        f"UPDATE {items_table} SET vesting_ms = v.vesting_ms, lease_id = v.lease_id,"
        f" record = v.record FROM ({rows}) AS v WHERE {items_table}.zone = :zone"
        f" AND {items_table}.id = v.id AND {items_table}.record = v.was"
        f" RETURNING {items_table}.id"
    )
    return _in(dialect, sql)


@functools.lru_cache(maxsize=256)
def delete_rows(items_table: str, dialect: str, n: int, *, leased: bool) -> str:
    """One statement that deletes ``n`` items of a zone (``:zone``; ``:i<k>``, and with
    ``leased`` ``:l<k>``, the lease each must still hold), returning the ids deleted: a
    batch of completions in one round trip."""
    if leased:
        pairs = ", ".join(f"(:i{k}, :l{k})" for k in range(n))
        which = f"(id, lease_id) IN (VALUES {pairs})"
    else:
        which = "id IN (" + ", ".join(f":i{k}" for k in range(n)) + ")"
    return _in(dialect, f"DELETE FROM {items_table} WHERE zone = :zone AND {which} RETURNING id")


@functools.lru_cache(maxsize=256)
def pull_rows(pointers_table: str, dialect: str, n: int) -> tuple[str, ...]:
    """Statements, run in this order in one transaction, that pull the idle pointers of
    ``n`` zones earlier (``:cluster``, ``:now``; for each row k ``:z<k>`` the zone and
    ``:v<k>`` the vesting time its pointer must not vest after); the last returns a row
    a pointer moved: the part twos of many applications' enqueues in one transaction."""
    rows = " UNION ALL ".join(f"SELECT :z{k} AS zone, :v{k} AS vesting_ms" for k in range(n))
    p = pointers_table
    if dialect == "sqlite":
        return (
            _in(
                dialect,
                f"UPDATE {p} SET vesting_ms = v.vesting_ms,"
                f" last_active_ms = max({p}.last_active_ms, :now), version = {p}.version + 1"
                f" FROM ({rows}) AS v WHERE {p}.cluster = :cluster AND {p}.zone = v.zone"
                f" AND {p}.version = (SELECT max(version) FROM {p} AS n"
                " WHERE n.cluster = :cluster AND n.zone = v.zone)"
                f" AND {p}.lease_id IS NULL AND {p}.vesting_ms > v.vesting_ms RETURNING 1",
            ),
        )
    # Each zone's newest version (LATERAL, LIMIT 1: the first index entry), then that
    # row by (pointer_id, version): a correlated max() there is no index condition, and
    # PostgreSQL walked every version of the zone.
    pull = _in(
        dialect,
        f"UPDATE {p} SET vesting_ms = v.vesting_ms,"
        f" last_active_ms = greatest({p}.last_active_ms, :now), version = {p}.version + 1"
        f" FROM ({rows}) AS v CROSS JOIN LATERAL (SELECT pointer_id, version FROM {p} AS n"
        " WHERE n.cluster = :cluster AND n.zone = v.zone ORDER BY version DESC LIMIT 1) AS cur"
        f" WHERE {p}.cluster = :cluster AND {p}.pointer_id = cur.pointer_id"
        f" AND {p}.version = cur.version AND {p}.lease_id IS NULL"
        f" AND {p}.{UNINDEXED_VESTING} > v.vesting_ms RETURNING 1",
    )
    # At READ COMMITTED a statement reads the versions its snapshot sees: a pointer a
    # visit requeued past the item after that snapshot would keep its old vesting time
    # there and be passed over. So the zones' newest versions are locked first, by a
    # statement of their own, in the zones' order (two such transactions never wait for
    # each other in a cycle), and the pull's own snapshot, taken after the locks, holds
    # each pointer's newest version.
    lock = _in(
        dialect,
        f"SELECT n.zone FROM ({rows}) AS v CROSS JOIN LATERAL (SELECT zone FROM {p}"
        " WHERE cluster = :cluster AND zone = v.zone ORDER BY version DESC LIMIT 1"
        " FOR NO KEY UPDATE) AS n ORDER BY n.zone",
    )
    return (lock, pull)


def _in(dialect: str, sql: str) -> str:
    made = sql if dialect == "sqlite" else _postgres(sql)
    assert isinstance(made, str)
    return made

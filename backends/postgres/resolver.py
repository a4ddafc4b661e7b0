"""The resolver's half of a commit, serialised by the row lock on ``quick_meta``: take the
lock, check the read conflict ranges against newer commits, apply the writes, record
their conflict ranges under the new version, bump the version; and prune conflict rows
past the 5 s lifetime.

Commits are serialised, so versions (and the versionstamps made from them) follow commit
order as FoundationDB's do: a commit takes the lock only after the one before it ended.

A commit is two round trips to the server (psycopg's pipeline mode): one takes the lock
and reads what the check and the atomic ops need (the newer commits' conflict ranges, the
current values of atomically updated keys); the other sends the writes, the conflict row
and the new version (and, for quick's own transactions, COMMIT). On a loaded machine a
round trip costs about a millisecond, so their number is the commit's cost.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import psycopg

from quickzones.backends._ranges import decode_ranges, encode_ranges, merge_ranges, ranges_intersect
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.postgres.errors import commit_unknown
from quickzones.backends.postgres.sql import EVERY_KEY, Statements
from quickzones.backends.txnbuffer import VERSIONS_PER_SECOND, CommitRequest
from quickzones.store.kv import (
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
)

# A pooled or application connection; rows as tuples.
Connection: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"

PRUNE_EVERY = 64  # commits per store object between prunes of old conflict rows


def apply(
    conn: Connection,
    sql: Statements,
    request: CommitRequest,
    now: float,
    *,
    begin: tuple[str, ...] = (),
    end: tuple[str, ...] = (),
    end_commits: bool = True,
) -> int:
    """The conflict check, the writes, their conflict ranges and the new version, on
    ``conn``; takes the resolver's lock (held until the transaction ends). ``begin`` are
    statements sent first (ending a snapshot, BEGIN, a SAVEPOINT), ``end`` statements sent
    last (COMMIT, or with ``end_commits=False`` a savepoint's RELEASE): each batch is one
    round trip. Returns the commit version."""
    rv = request.read_version
    atomic = request.atomic_keys()
    with conn.pipeline():
        for statement in begin:
            conn.execute(statement)
        locked = conn.execute(sql.lock_version)
        newer = conn.execute(sql.newer_conflicts, (rv,)) if rv is not None else None
        current = conn.execute(sql.get_many, (atomic,)) if atomic else None
    row = locked.fetchone()
    assert row is not None, "quick_meta has its row"
    version = int(row[0])
    if request.too_old(now):
        raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
    if newer is not None and request.read_conflicts and version > (rv or 0):
        for (raw,) in newer.fetchall():
            if ranges_intersect(request.read_conflicts, decode_ranges(bytes(raw))):
                raise KVError(NOT_COMMITTED, "a read conflicts with a later commit")
    values: dict[bytes, bytes] = {}
    if current is not None:
        values = {bytes(k): bytes(v) for k, v in current.fetchall()}
    commit_version = max(version + 1, int(now * VERSIONS_PER_SECOND))
    writes = request.resolve(make_versionstamp(commit_version, 0), values.get)
    conflict_ranges = request.write_conflicts
    if writes.extra_write_conflicts:
        conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
    try:
        with conn.pipeline(), conn.cursor() as cur:
            if writes.clears:
                cur.executemany(sql.delete_range, writes.clears)
            if writes.sets:
                cur.executemany(sql.upsert, writes.sets)
            if writes.deletes:
                cur.executemany(sql.delete, [(key,) for key in writes.deletes])
            cur.execute(sql.record_conflicts, (commit_version, encode_ranges(conflict_ranges)))
            cur.execute(sql.bump_version, (commit_version,))
            for statement in end:
                cur.execute(statement)
    except psycopg.Error as err:
        if end and end_commits and conn.broken:
            # COMMIT went out with the writes and no answer came: it may have committed.
            raise commit_unknown(err) from err
        raise
    return commit_version


def prune(conn: Connection, sql: Statements, now: float) -> None:
    """Delete conflict rows older than the 5 s lifetime (plus 1 s of slack), keeping in
    their place one row, at the newest pruned version, that conflicts with every read
    (an application's transaction may commit a version taken earlier: a reader from
    before then fails and retries instead of missing it). Runs under the lock, in a
    transaction of its own."""
    horizon = int((now - TRANSACTION_LIFETIME_S - 1.0) * VERSIONS_PER_SECOND)
    with conn.transaction():
        conn.execute(sql.lock_version)
        row = conn.execute(sql.newest_before, (horizon,)).fetchone()
        newest: int | None = None if row is None else row[0]
        if newest is None:
            return
        conn.execute(sql.prune_conflicts, (horizon,))
        conn.execute(sql.record_conflicts, (newest, EVERY_KEY))

"""The resolver's half of a commit, serialised by the row lock on ``quick_meta``: the
server's ``quick_commit`` (``sql.py``) takes the lock, checks the read conflict ranges
against newer commits, records the write conflict ranges under the new version, bumps it
and applies the writes, all in one statement; and old conflict rows are pruned past the
5 s lifetime.

Commits are serialised, so versions (and the versionstamps made from them) follow commit
order as FoundationDB's do: a commit takes the lock only after the one before it ended.

The lock is held only while the server works: the check, the writes and COMMIT go out in
one pipeline (psycopg's pipeline mode), so no commit waits on another's round trip to its
client or on that client's CPU (a thread that must also win its process's GIL). A commit
whose writes need the committed state (atomic operations other than adds, whose operands
are the current values; versionstamps, made from the commit version) reads it first
without the lock, in one statement, computes its writes, and sends with them what it read
them at: ``quick_resolve`` refuses (``MOVED_STATE``) if a newer commit wrote one of those
keys or took the version the stamp was made from, and the commit reads again and retries.
Adds (quick's counts) are applied by the server (``quick_add``). So a commit is one round
trip, or two with versionstamps or atomic operations other than adds.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

import psycopg

from quickzones.backends._ranges import merge_ranges
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.postgres.errors import commit_unknown, pipeline
from quickzones.backends.postgres.sql import CONFLICT_STATE, EVERY_KEY, MOVED_STATE, Statements
from quickzones.backends.txnbuffer import VERSIONS_PER_SECOND, CommitRequest
from quickzones.backends.txnbuffer.commit_request import ResolvedWrites
from quickzones.store.kv import (
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
    key_after,
)

# A pooled or application connection; rows as tuples.
Connection: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"


class Rows(Protocol):
    """A statement's answer (a psycopg cursor, or rows read from the event loop)."""

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


PRUNE_EVERY = 64  # commits per store object between prunes of old conflict rows
# Reads of the committed state one commit makes at most before it gives up with a
# retryable conflict (each retry means another commit wrote its atomic keys meanwhile).
MOVED_RETRIES = 20
_NO_STAMP = bytes(10)
# How far ahead of the clock a commit that makes a versionstamp takes its version
# (versions stay within this of the clock: pruning goes by the clock).
STAMP_AHEAD_S = 0.05


def _columns(ranges: list[tuple[bytes, bytes]]) -> tuple[list[bytes], list[bytes]]:
    return [b for b, _ in ranges], [e for _, e in ranges]


def apply(
    conn: Connection,
    sql: Statements,
    request: CommitRequest,
    now: float,
    *,
    begin: tuple[str, ...] = (),
    end: tuple[str, ...] = (),
    end_commits: bool = True,
    undo: tuple[str, ...] = ("ROLLBACK",),
    again: tuple[str, ...] = ("BEGIN",),
) -> int:
    """Commit ``request`` on ``conn`` through the resolver (whose lock is held until the
    transaction ends). ``begin`` are statements sent first (ending a snapshot, BEGIN, a
    SAVEPOINT), ``end`` statements sent last (COMMIT, or with ``end_commits=False`` a
    savepoint's RELEASE); ``undo`` ends a try whose operands moved and ``again`` begins
    the next. Returns the commit version."""
    if request.too_old(now):
        raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
    adds = request.plain_adds()
    atomic = [key for key in request.atomic_keys() if key not in adds]
    if not atomic and not request.needs_version():
        writes = request.resolve(_NO_STAMP, _no_current, skip=adds)
        at_least = int(now * VERSIONS_PER_SECOND)
        return _send(conn, sql, request, writes, adds, begin, end, end_commits, None, [], at_least)
    for _ in range(MOVED_RETRIES):
        with pipeline(conn):
            for statement in begin:
                conn.execute(statement)
            cur = conn.execute(sql.version_and_values, (atomic,))
        rows = cur.fetchall()
        since = int(rows[0][0])
        values = {bytes(k): bytes(v) for _, k, v in rows if k is not None}
        # The stamp's version a little ahead of the clock, so that the commits other
        # clients make meanwhile (which take the clock's) leave it free.
        at_least = max(since + 1, int((now + STAMP_AHEAD_S) * VERSIONS_PER_SECOND))
        writes = request.resolve(make_versionstamp(at_least, 0), values.get, skip=adds)
        try:
            return _send(
                conn, sql, request, writes, adds, (), end, end_commits, since, atomic, at_least
            )
        except _Moved:
            for statement in undo:
                conn.execute(statement)
            begin = again
    raise KVError(NOT_COMMITTED, "other commits kept writing this commit's atomic keys")


class _Moved(Exception):
    """quick_resolve refused: the state the writes were computed from is no longer the
    newest (the transaction is aborted; the caller's ``undo`` ends it)."""


def _or_null(values: list[bytes]) -> list[bytes] | None:
    return values or None


def _no_current(key: bytes) -> bytes | None:
    raise AssertionError(f"no atomic operation was buffered, yet {key!r} was asked for")


def _send(
    conn: Connection,
    sql: Statements,
    request: CommitRequest,
    writes: ResolvedWrites,
    adds: dict[bytes, bytes],
    begin: tuple[str, ...],
    end: tuple[str, ...],
    end_commits: bool,
    since: int | None,
    atomic: list[bytes],
    at_least: int,
) -> int:
    """One round trip: ``begin``, quick_commit (the check and the writes), ``end``."""
    conflict_ranges = request.write_conflicts
    if writes.extra_write_conflicts:
        conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
    rb, re_ = _columns(request.read_conflicts)
    wb, we = _columns(conflict_ranges)
    ae = [key_after(k) for k in atomic]
    cb, ce = _columns(writes.clears)
    sk, sv = [k for k, _ in writes.sets], [v for _, v in writes.sets]
    # An empty array goes as NULL (the functions read both as none): most of a commit's
    # arrays are empty, and psycopg's dump of each costs more than the statement's send.
    n = _or_null
    args: tuple[object, ...] = (
        *(request.read_version, n(rb), n(re_), since, n(atomic), n(ae), wb, we, at_least),
        *(n(cb), n(ce), n(sk), n(sv), n(writes.deletes), n(list(adds)), n(list(adds.values()))),
    )
    try:
        with pipeline(conn), conn.cursor() as cur:
            for statement in begin:
                cur.execute(statement)
            if request.wakes_watchers:
                resolved = conn.execute(sql.commit_waking, (*args, *sql.notify_args))
            else:
                resolved = conn.execute(sql.commit, args)
            for statement in end:
                cur.execute(statement)
    except psycopg.Error as err:
        state = getattr(err, "sqlstate", None)
        if state == CONFLICT_STATE:
            raise KVError(NOT_COMMITTED, "a read conflicts with a later commit") from err
        if state == MOVED_STATE:
            raise _Moved() from err
        if end and end_commits and conn.broken:
            # COMMIT went out with the writes and no answer came: it may have committed.
            raise commit_unknown(err) from err
        raise
    row = resolved.fetchone()
    assert row is not None, "quick_commit returns the commit version"
    return int(row[0])


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
        conn.execute(sql.record_conflicts, (newest, *EVERY_KEY))

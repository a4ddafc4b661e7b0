"""The resolver's half of a commit: the server's ``quick_commit3`` (``sql.py``) takes
the commit's advisory locks (``locks.py``), checks its read conflict ranges against the
commits its snapshot did not see, records its write conflict ranges in ``quick_log`` and
applies the writes, all in one statement; old log rows are pruned past the 5 s lifetime.

Only commits that touch the same keys wait for each other, and only while the server works
(or, for an application's transaction, until its COMMIT): the locks, the check, the writes
and COMMIT go out in one pipeline, so no commit waits on another's round trip to its client.
A commit whose writes need the committed state (atomic operations other than adds, whose
operands are the current values; versionstamps, made from the commit version) reads it
first, with its snapshot and its commit version, in one statement, computes its writes, and
sends with them the snapshot it read them in: ``quick_commit3`` refuses (``MOVED_STATE``)
if a commit that snapshot did not see wrote one of those keys, and the commit reads again.
Adds (quick's counts) are applied by the server (``quick_add``). So a commit is one round
trip, or two with versionstamps or atomic operations other than adds.

Commit versions come from a sequence, taken under the commit's locks: two commits that
touch the same keys get them in commit order, as FoundationDB's versions are; commits that
share no key are not ordered by anything a transaction can observe. A commit with a
versionstamp takes its version before its locks (the stamp is in its writes): a commit
that starts after another ended gets a later stamp, but two FIFO enqueues into one zone at
the same moment may commit in the other order than their stamps (FoundationDB orders
them by commit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import psycopg

from quickzones.backends._ranges import merge_ranges
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.postgres import wire
from quickzones.backends.postgres.errors import commit_unknown, pipeline
from quickzones.backends.postgres.known_reads import Seen
from quickzones.backends.postgres.locks import plan
from quickzones.backends.postgres.sql import CONFLICT_STATE, MOVED_STATE, Statements
from quickzones.backends.txnbuffer import CommitRequest
from quickzones.backends.txnbuffer.commit_request import ResolvedWrites
from quickzones.store.kv import (
    NOT_COMMITTED,
    TRANSACTION_TOO_OLD,
    EarlierIfLater,
    KVError,
    key_after,
)

# A pooled or application connection; rows as tuples.
Connection: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"


class Rows(Protocol):
    """A statement's answer (a psycopg cursor, or rows read from the event loop)."""

    def fetchone(self) -> tuple[Any, ...] | None: ...

    def fetchall(self) -> list[tuple[Any, ...]]: ...


PRUNE_EVERY = 64  # commits per store object between prunes of old log rows
# Reads of the committed state one commit makes at most before it gives up with a
# retryable conflict (each retry means another commit wrote its atomic keys meanwhile).
MOVED_RETRIES = 20
_NO_STAMP = bytes(10)


@dataclass(frozen=True, slots=True)
class Guard:
    """Writes the server makes at commit only where ``key`` is absent then
    (``kv.create_if_absent``: an enqueue's pointer, made where its zone has none), with
    ``expect``: values the commit fails on (a read conflict) unless they are still those
    (None: absent). Sent as ``quick_ensure3`` after quick_commit3, under its locks: the
    key and the writes' keys take exclusive locks and count as written in the commit's log
    row (whether or not the server writes them), the expected keys take shared ones. After
    COMMIT, in the same round trip, ``key`` and the key ``follow[0] + its value +
    follow[1]`` are read with that statement's snapshot (``keep``) where ``key``'s value
    is not the one it wrote (a key absent from what was read: the server wrote). ``wake``: where the
    server writes, it notifies as a commit with ``kv.wake_watchers`` does."""

    key: bytes
    writes: tuple[tuple[bytes, bytes], ...]
    expect: Mapping[bytes, bytes | None]
    follow: tuple[bytes, bytes]
    # Other processes' commit watchers hear of the commit where the server writes.
    wake: bool = False

    @property
    def mine(self) -> bytes:
        """The value it writes at its key."""
        return next(v for k, v in self.writes if k == self.key)

    def written(self) -> list[tuple[bytes, bytes]]:
        """Its write conflict ranges: its key's and its writes' (points)."""
        keys = sorted({self.key, *(k for k, _ in self.writes)})
        return [(k, k + b"\x00") for k in keys]

    def expected(self) -> list[tuple[bytes, bytes]]:
        return [(k, k + b"\x00") for k in sorted(self.expect)]


def _pulled(pulls: Sequence[EarlierIfLater]) -> list[tuple[bytes, bytes]]:
    """The keys the ``pulls`` write where made, locked exclusive but not counted as
    written unless made (quick_pull3 adds them to the commit's log row then): each
    record's (every commit that moves a pointer's vesting entry writes its record, so
    that lock also covers the old entry, whose key only the server learns) and each new
    entry's."""
    return [(k, k + b"\x00") for e in pulls for k in sorted((e.key, e.new_entry))]


def _columns(ranges: list[tuple[bytes, bytes]]) -> tuple[list[bytes], list[bytes]]:
    return [b for b, _ in ranges], [e for _, e in ranges]


def apply(
    conn: Connection,
    sql: Statements,
    request: CommitRequest,
    now: float,
    *,
    snapshot: str | None,
    space: int,
    begin: tuple[str, ...] = (),
    end: tuple[str, ...] = (),
    end_commits: bool = True,
    undo: tuple[str, ...] = ("ROLLBACK",),
    again: tuple[str, ...] = ("BEGIN",),
    keep: Seen | None = None,
    held_long: bool = False,
    guards: Sequence[Guard] = (),
    pulls: Sequence[EarlierIfLater] = (),
) -> int:
    """Commit ``request`` on ``conn`` (its locks held until the transaction ends).
    ``snapshot``: the one its reads saw (None: nothing read, nothing to check); ``space``:
    the schema's advisory lock space. ``begin`` are statements sent first (ending a
    snapshot, BEGIN, a SAVEPOINT), ``end`` statements sent last (COMMIT, or with
    ``end_commits=False`` a savepoint's RELEASE); ``undo`` ends a try whose operands moved
    and ``again`` begins the next. ``keep``: a :class:`Seen` whose keys are read after
    COMMIT in the same round trip, with that statement's snapshot, filled in place (on
    quick's own connections, see ``known_reads.py``). ``held_long``: the transaction stays
    open after (an application's), see :func:`locks.plan`. ``guards``: writes the server
    makes only where a key is absent (:class:`Guard`; quick's own connections only), their
    keys and followed keys kept in ``keep``. ``pulls``: rewrites the server makes where a
    record is still as expected (``kv.earlier_if_later``; quick's own connections only).
    Returns the commit version."""
    if request.too_old(now):
        raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
    if request.read_version is None:
        snapshot = None
    adds = request.plain_adds()
    atomic = [key for key in request.atomic_keys() if key not in adds]
    at = int(now * 1_000_000)
    if not atomic and not request.needs_version():
        writes = request.resolve(_NO_STAMP, _no_current, skip=adds)
        return _send(
            conn, sql, request, writes, adds, begin, end, end_commits,
            (snapshot, space, None, [], None, at), keep, held_long, guards, pulls,
        )  # fmt: skip
    for _ in range(MOVED_RETRIES):
        with pipeline(conn):
            for statement in begin:
                conn.execute(statement, prepare=False)
            cur = conn.execute(sql.snapshot_and_values, (atomic,), prepare=False)
        rows = cur.fetchall()
        since, version = str(rows[0][0]), int(rows[0][1])
        values = {bytes(k): bytes(v) for _, _, k, v in rows if k is not None}
        writes = request.resolve(make_versionstamp(version, 0), values.get, skip=adds)
        try:
            return _send(
                conn, sql, request, writes, adds, (), end, end_commits,
                (snapshot, space, since if atomic else None, atomic, version, at),
                None, held_long, guards, pulls,  # keeps nothing (known_reads.py)
            )  # fmt: skip
        except _Moved:
            for statement in undo:
                conn.execute(statement, prepare=False)
            begin = again
    raise KVError(NOT_COMMITTED, "other commits kept writing this commit's atomic keys")


class _Moved(Exception):
    """quick_commit3 refused: the state the writes were computed from is no longer the
    newest (the transaction is aborted; the caller's ``undo`` ends it)."""


def _or_null(values: list[Any]) -> list[Any] | None:
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
    how: tuple[str | None, int, str | None, list[bytes], int | None, int],
    keep: Seen | None = None,
    held_long: bool = False,
    guards: Sequence[Guard] = (),
    pulls: Sequence[EarlierIfLater] = (),
) -> int:
    """One round trip: ``begin``, quick_commit3 (locks, checks and writes), ``end``.
    ``how``: the reads' snapshot, the lock space, the atomic operands' snapshot and keys,
    the commit version taken beforehand (None: the server takes one), the clock in us."""
    snapshot, space, since, atomic, version, at = how
    conflict_ranges = request.write_conflicts
    if writes.extra_write_conflicts:
        conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
    reads = request.read_conflicts if snapshot is not None else []
    locked_reads = reads
    if guards:
        written = [r for guard in guards for r in guard.written()]
        conflict_ranges = merge_ranges(conflict_ranges + written)
        locked_reads = [*reads, *(r for guard in guards for r in guard.expected())]
    locked_writes = [*conflict_ranges, *_pulled(pulls)] if pulls else conflict_ranges
    lock_ids, exclusive = plan(locked_reads, locked_writes, held_long=held_long)
    rb, re_ = _columns(reads)
    wb, we = _columns(conflict_ranges)
    ae = [key_after(k) for k in atomic]
    cb, ce = _columns(writes.clears)
    sk, sv = [k for k, _ in writes.sets], [v for _, v in writes.sets]
    # Keys to read after the commit (KVTransaction.read_after_commit): a statement of its
    # own after COMMIT in the same round trip, on the autocommit connection.
    after: Sequence[bytes] = request.read_after if end and end_commits else []
    if keep is not None and not (end and end_commits and wire.usable(conn)):
        keep = None
    if (guards or pulls) and not wire.usable(conn):
        raise AssertionError("guards and pulls are sent on quick's own connections only")
    if keep is not None:
        # Part two's keys and the kept ones in one statement, with its snapshot.
        # With guards: their expected keys too (what the next enqueue reads), and their
        # keys with the keys their values name (several: where not their own), below.
        guarded = [k for guard in guards for k in guard.expect]
        if len(guards) == 1:
            guarded.append(guards[0].key)
        after = list(dict.fromkeys([*after, *keep.values, *guarded]))
    waking = request.wakes_watchers and end_commits
    deletes, add_keys, add_values = writes.deletes, list(adds), list(adds.values())
    read: Rows | None = None
    resolved: Rows
    try:
        if wire.usable(conn):
            # An empty array goes as NULL (the function reads both as none).
            b = wire.byteas
            params = [
                *(wire.text(snapshot), b(rb), b(re_), wire.int4(space), wire.int4s(lock_ids)),
                *(wire.bools(exclusive), wire.text(since), b(atomic), b(ae), b(wb), b(we)),
                *(wire.int8(version), wire.int8(at), b(cb), b(ce), b(sk), b(sv), b(deletes)),
                *(b(add_keys), b(add_values), wire.text(sql.lock_timeout)),
            ]
            if waking:
                params += [wire.text(arg) for arg in sql.notify_args]
            texts = sql.wire
            statements = [
                *(wire.plain(statement) for statement in begin),
                (texts["commit_waking" if waking else "commit"], params, False),
            ]
            if guards:
                # One call for all of them; each write tagged with its guard's place.
                expect = {k: v for guard in guards for k, v in guard.expect.items()}
                tags = [n for n, guard in enumerate(guards, 1) for _ in guard.writes]
                wake = any(guard.wake for guard in guards)
                statements.append(
                    (
                        texts["ensure"],
                        [
                            *(b([guard.key for guard in guards]), wire.int4s(tags)),
                            b([k for guard in guards for k, _ in guard.writes]),
                            b([v for guard in guards for _, v in guard.writes]),
                            *(b(list(expect)), b(list(expect.values()))),
                            *(wire.text(arg if wake else None) for arg in sql.notify_args),
                        ],
                        False,
                    )
                )
            if pulls:
                statements.append(
                    (
                        texts["pull"],
                        [
                            *(b([e.index_key for e in pulls]), b([e.index for e in pulls])),
                            b([e.key for e in pulls]),
                            *(b([e.head for e in pulls]), wire.int8s([e.limit for e in pulls])),
                            *(b([e.record for e in pulls]), b([e.entry[0] for e in pulls])),
                            *(b([e.entry[1] for e in pulls]), b([e.new_entry for e in pulls])),
                            *(wire.text(arg) for arg in sql.notify_args),
                        ],
                        False,
                    )
                )
            statements.extend(wire.plain(statement) for statement in end)
            # A read after COMMIT: its failure must not fail the commit, which is stored.
            soft = len(statements) if keep is not None or after else None
            if keep is not None and len(guards) == 1:
                (guard,) = guards
                following = [b(after), wire.bytea(guard.follow[0]), wire.bytea(guard.key)]
                following.append(wire.bytea(guard.follow[1]))
                statements.append((texts["seen_following"], following, True))
            elif keep is not None and guards:
                following = [b(after), b([g.key for g in guards]), b([g.mine for g in guards])]
                following += [b([g.follow[0] for g in guards]), b([g.follow[1] for g in guards])]
                statements.append((texts["seen_following_many"], following, True))
            elif keep is not None:
                statements.append((texts["seen_many"], [b(after)], True))
            elif after:
                statements.append((texts["get_many"], [b(after)], True))
            answers = wire.exchange(conn, statements, soft_from=soft)
            resolved = answers[len(begin)]
            read = answers[-1] if after and not answers[-1].failed else None
        else:
            # psycopg's dump of each empty array costs more than the statement's send.
            n = _or_null
            args: tuple[object, ...] = (
                *(snapshot, n(rb), n(re_), space, n(lock_ids), n(exclusive), since),
                *(n(atomic), n(ae), n(wb), n(we), version, at, n(cb), n(ce), n(sk), n(sv)),
                *(n(deletes), n(add_keys), n(add_values), sql.lock_timeout),
            )
            with pipeline(conn), conn.cursor() as cur:
                for statement in begin:
                    cur.execute(statement, prepare=False)
                if waking:
                    resolved = conn.execute(
                        sql.commit_waking, (*args, *sql.notify_args), prepare=False
                    )
                else:
                    resolved = conn.execute(sql.commit, args, prepare=False)
                for statement in end:
                    cur.execute(statement, prepare=False)
                if after:
                    read = conn.execute(sql.get_many, (after,), prepare=False)
    except psycopg.Error as err:
        state = getattr(err, "sqlstate", None)
        if state == CONFLICT_STATE:
            raise KVError(NOT_COMMITTED, "a read conflicts with a later commit") from err
        if state == MOVED_STATE:
            raise _Moved() from err
        if end and end_commits and conn.broken:
            # COMMIT went out with the writes and no answer came: it may have committed.
            # Its log row (written when it has write ranges) tells the store whether.
            raise commit_unknown(err, (at, wb, we) if wb else None) from err
        raise
    row = resolved.fetchone()
    assert row is not None, "quick_commit3 returns the commit version"
    if read is not None:
        found: dict[bytes, bytes | None] = dict.fromkeys(after)
        rows = read.fetchall()
        if keep is not None:
            # (snapshot, last commit version, key, value), the key NULL when none was found.
            keep.snapshot = rows[0][0].decode()
            keep.version = int.from_bytes(rows[0][1], "big", signed=True)
            found.update((k, v) for _, _, k, v in rows if k is not None)
            for guard in guards:
                # The key each guard's value names, read in the same snapshot (absent: None).
                value = found.get(guard.key)
                if value is not None:
                    found.setdefault(guard.follow[0] + value + guard.follow[1], None)
            # Part two's keys too: read in the same snapshot, they answer its first read.
            keep.values = found
        else:
            found.update((bytes(k), bytes(v)) for k, v in rows)
        if request.read_after:
            request.read_after_values = {key: found[key] for key in request.read_after}
    return int(row[0])


def prune(conn: Connection, sql: Statements, seen_before: str) -> None:
    """Delete the log rows of commits that ``seen_before``, a snapshot taken more than
    6 s ago, saw: every transaction still able to commit read after it (5 s lifetime)."""
    conn.execute(sql.prune_log, (seen_before, seen_before), prepare=False)

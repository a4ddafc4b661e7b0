"""The resolver's half of a commit, serialised by SQLite's write lock: take the lock,
check the read conflict ranges against newer commits, apply the writes, record their
conflict ranges under the new version; and prune conflict rows past the 5 s lifetime."""

from __future__ import annotations

import logging
import sqlite3

from quickzones.backends._ranges import decode_ranges, encode_ranges, merge_ranges, ranges_intersect
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.sqlite.errors import _is_busy, _is_full, _translate
from quickzones.backends.sqlite.sql import (
    _ADD,
    _BUMP_VERSION,
    _DELETE,
    _DELETE_RANGE,
    _EVERY_KEY,
    _GET,
    _NEWER_CONFLICTS,
    _NEWEST_BEFORE,
    _PRUNE_CONFLICTS,
    _RECORD_CONFLICTS,
    _UPSERT,
    _VERSION,
    blob,
    read_many,
)
from quickzones.backends.sqlite.state import SQLiteStoreState
from quickzones.backends.txnbuffer import VERSIONS_PER_SECOND, CommitRequest
from quickzones.store.kv import (
    COMMIT_UNKNOWN_RESULT,
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
)

log = logging.getLogger("quick.sqlite")

_PRUNE_EVERY = 64  # commits per process between prunes of old conflict rows


class CommitResolver(SQLiteStoreState):
    """How a store commits a :class:`~quickzones.backends.txnbuffer.CommitRequest`."""

    def _commit_on(self, conn: sqlite3.Connection, request: CommitRequest) -> int:
        locked_at = self._lock_in_snapshot(conn, request) if conn.in_transaction else None
        in_snapshot = locked_at is not None
        if locked_at is None:
            self._begin_immediate(conn)
        read: dict[bytes, bytes | None] | None = None
        try:
            commit_version = self._apply(conn, request, locked_at=locked_at, own=True)
            if request.read_after:
                # Under the write lock nothing else commits before this COMMIT: these
                # are the values just after it, read without a transaction of their own,
                # or known from this store's last commit when nothing came between.
                read = self._known.lookup(request, in_snapshot)
                if read is None:
                    read = _read_many(conn, request.read_after)
                request.read_after_values = read
            self._foreign.made(commit_version)
            followers_wrote = bool(request.followers) and self._follow(
                conn, request, commit_version, read
            )
            self._commits += 1
            if self._commits % _PRUNE_EVERY == 0:
                _prune_conflicts(conn, self.clock.now())
        except BaseException as err:
            self._known.forget()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise _translate(err, "commit", self.url) from err
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as err:
            self._known.forget()
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # COMMIT failed and left the transaction open
                raise _translate(err, "COMMIT", self.url) from err
            if _is_full(err):
                # Out of space while appending to the WAL: SQLite rolled back and the
                # frames were never marked committed, so nothing of it is visible.
                raise _translate(err, "COMMIT", self.url) from err
            raise KVError(COMMIT_UNKNOWN_RESULT, f"sqlite COMMIT failed: {err}") from err
        if followers_wrote:
            # What they wrote is not in the request: this commit's known values stand no more.
            self._known.forget()
        else:
            self._known.committed(request, commit_version, in_snapshot=in_snapshot, read=read)
        return commit_version

    def _follow(
        self,
        conn: sqlite3.Connection,
        request: CommitRequest,
        version: int,
        read: dict[bytes, bytes | None] | None,
    ) -> bool:
        """Run ``request``'s followers (:func:`~quickzones.store.kv.follow_in_commit`)
        on ``conn``, which holds the write lock with the request's writes applied: each
        is a transaction that reads the newest state and commits its writes under a
        version of its own (an :class:`AppTransaction` on ``conn``: it cannot conflict,
        nothing else commits meanwhile), inside a savepoint, so that one that fails
        leaves nothing and the request's own COMMIT goes ahead. ``read``: the values of
        ``request.read_after`` just read or known (the first follower's reads of them cost
        no statement). Returns whether any follower wrote."""
        from quickzones.backends.sqlite.app_transaction import AppTransaction

        wrote = False
        for follow, needed in request.followers:
            if needed is not None and read is not None and not needed(read):
                continue  # what its reads would see says it has nothing to do
            tr = AppTransaction(self, conn, version=version, known=read)  # type: ignore[arg-type]
            try:
                follow(tr)
                tr.commit()
            except Exception:
                log.warning("a transaction following a commit failed; its writes are dropped",
                            exc_info=True)  # fmt: skip
                continue
            made = tr.get_committed_version()
            if made > 0:  # -1: it only read
                self._foreign.made(made)
                wrote = True
                version, read = made, None
        return wrote

    def _lock_in_snapshot(self, conn: sqlite3.Connection, request: CommitRequest) -> int | None:
        """Take the write lock inside the read snapshot ``conn`` holds, by writing the
        commit version: SQLite allows it only while no other commit came after the
        snapshot, so nothing can conflict with the reads and the snapshot's transaction
        becomes the commit's (one transaction for the file instead of two). Returns that
        version, or None with the snapshot ended when another commit came first or holds
        the lock (the caller takes the lock anew and checks the conflicts)."""
        rv = request.read_version
        now = self.clock.now()
        if rv is not None and not request.too_old(now):
            commit_version = max(rv + 1, int(now * VERSIONS_PER_SECOND))
            try:
                conn.execute(_BUMP_VERSION, (commit_version,))
                return commit_version
            except sqlite3.OperationalError as err:
                if not _is_busy(err):  # SQLITE_BUSY_SNAPSHOT included
                    raise _translate(err, "commit", self.url) from err
        if conn.in_transaction:
            conn.execute("COMMIT")  # end the snapshot: the write lock needs the newest state
        return None

    def _apply(
        self,
        conn: sqlite3.Connection,
        request: CommitRequest,
        *,
        locked_at: int | None = None,
        own: bool = False,
    ) -> int:
        """The resolver's half of a commit, on ``conn`` holding the write lock: the
        conflict check, the writes, their conflict ranges and the new version; the caller
        commits (or, for an application's connection, the application does).
        ``locked_at``: the commit version already written by :meth:`_lock_in_snapshot`
        (no commit since the reads: nothing to check). ``own``: ``conn`` is one of the
        store's, with quick_add registered (an application's connection is left as it is)."""
        now = self.clock.now()
        if request.too_old(now):
            raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
        if locked_at is None:
            version: int = conn.execute(_VERSION).fetchone()[0]
            rv = request.read_version
            if rv is not None and request.read_conflicts and version > rv:
                for (raw,) in conn.execute(_NEWER_CONFLICTS, (rv,)):
                    if ranges_intersect(request.read_conflicts, decode_ranges(raw)):
                        raise KVError(NOT_COMMITTED, "a read conflicts with a later commit")
            commit_version = max(version + 1, int(now * VERSIONS_PER_SECOND))
        else:
            commit_version = locked_at
        adds = request.plain_adds() if own else {}
        writes = request.resolve(
            make_versionstamp(commit_version, 0), lambda key: _current(conn, key), skip=adds
        )
        if writes.clears:
            conn.executemany(_DELETE_RANGE, [(blob(b), blob(e)) for b, e in writes.clears])
        if adds:
            # Keys of atomic adds are in no cleared range (an add there is a plain set).
            conn.executemany(_ADD, [(blob(k), blob(p)) for k, p in adds.items()])
        if writes.sets:
            conn.executemany(_UPSERT, [(blob(k), blob(v)) for k, v in writes.sets])
        if writes.deletes:
            conn.executemany(_DELETE, [(blob(key),) for key in writes.deletes])
        conflict_ranges = request.write_conflicts
        if writes.extra_write_conflicts:
            conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
        conn.execute(_RECORD_CONFLICTS, (commit_version, blob(encode_ranges(conflict_ranges))))
        if locked_at is None:
            conn.execute(_BUMP_VERSION, (commit_version,))
        return commit_version


def _prune_conflicts(conn: sqlite3.Connection, now: float) -> None:
    """Delete conflict rows older than the 5 s lifetime (plus 1 s of slack), keeping in
    their place one row, at the newest pruned version, that conflicts with every read.

    A commit's version is normally its commit time, so no live transaction read before
    a pruned row and the kept row conflicts with nothing live. An application's own
    transaction (:meth:`SQLiteStore.transaction_on`) takes its version when it enqueues
    but commits when the application does, possibly later: a transaction that read
    before that commit then fails with a conflict (and is retried) instead of missing it.
    """
    horizon = int((now - TRANSACTION_LIFETIME_S - 1.0) * VERSIONS_PER_SECOND)
    newest = conn.execute(_NEWEST_BEFORE, (horizon,)).fetchone()[0]
    if newest is None:
        return
    conn.execute(_PRUNE_CONFLICTS, (horizon,))
    conn.execute(_RECORD_CONFLICTS, (newest, _EVERY_KEY))


def _read_many(conn: sqlite3.Connection, keys: list[bytes]) -> dict[bytes, bytes | None]:
    found: dict[bytes, bytes | None] = dict.fromkeys(keys)
    found.update(read_many(conn, keys))
    return found


def _current(conn: sqlite3.Connection, key: bytes) -> bytes | None:
    row = conn.execute(_GET, (blob(key),)).fetchone()
    return None if row is None else bytes(row[0])

"""A transaction on a SQLite store: the storage half of a buffered transaction, read
from a WAL snapshot and committed through the store's resolver."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from quickzones.backends.sqlite.errors import _translate
from quickzones.backends.sqlite.sql import (
    _GET,
    _POINTS_UP_TO,
    _RANGE,
    _RANGE_REVERSE,
    _VERSION,
    _VERSION_AND_GET_OF,
    blob,
    read_many,
)
from quickzones.backends.txnbuffer import CommitRequest, KeyValue
from quickzones.backends.txnbuffer.pooled import PooledTransaction
from quickzones.errors import StoreBusy
from quickzones.store.kv import KVTransaction

if TYPE_CHECKING:
    from quickzones.backends.sqlite.store import SQLiteStore


class SQLiteTransaction(PooledTransaction[sqlite3.Connection]):
    """A transaction on a :class:`SQLiteStore`; holds a WAL snapshot while it reads."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        super().__init__(store)

    def _acquire_read_version(self) -> int:
        conn = self._store._acquire()
        try:
            conn.execute("BEGIN")  # deferred: the snapshot starts with the next read
            version: int = conn.execute(_VERSION).fetchone()[0]
        except sqlite3.Error as err:
            self._store._release(conn)
            raise _translate(err, "read version") from err
        self._conn = conn
        return version

    def _read_version_and_keys(self, keys: Sequence[bytes]) -> tuple[int, list[bytes | None]]:
        if not 0 < len(keys) <= _POINTS_UP_TO:
            return super()._read_version_and_keys(keys)
        conn = self._store._acquire()
        try:
            conn.execute("BEGIN")  # deferred: the snapshot starts with the next statement
            rows = conn.execute(_VERSION_AND_GET_OF[len(keys)], [blob(k) for k in keys])
            found: dict[bytes | None, bytes] = dict(rows.fetchall())
        except sqlite3.Error as err:
            self._store._release(conn)
            raise _translate(err, "read version") from err
        self._conn = conn
        version = int(found.pop(None))  # the row without a key
        return version, [found.get(key) for key in keys]

    def _read_key(self, key: bytes) -> bytes | None:
        conn = self._snapshot()
        try:
            row = conn.execute(_GET, (blob(key),)).fetchone()
        except sqlite3.Error as err:
            raise _translate(err, "get") from err
        return None if row is None else bytes(row[0])

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        conn = self._snapshot()
        try:
            found = read_many(conn, keys)
        except sqlite3.Error as err:
            raise _translate(err, "get_many") from err
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        conn = self._snapshot()
        sql = _RANGE_REVERSE if reverse else _RANGE
        try:
            rows = conn.execute(sql, (blob(begin), blob(end), limit or -1)).fetchall()
        except sqlite3.Error as err:
            raise _translate(err, "get_range") from err
        return [(bytes(k), bytes(v)) for k, v in rows]

    def follow_in_commit(
        self,
        follow: Callable[[KVTransaction], None],
        needed: Callable[[dict[bytes, bytes | None]], bool] | None = None,
    ) -> bool:
        """See :func:`quickzones.store.kv.follow_in_commit`: every commit here holds the
        store's write lock (SQLiteStore._commit_on), which runs ``follow`` before COMMIT."""
        self._check_open()
        self._followers.append((follow, needed))
        return True

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        store = self._store
        conn = self._take_connection()
        try:
            # Threads of one process queue on a Python lock rather than in SQLite's busy
            # handler, whose sleeps (up to 100 ms each) would make a long latency tail.
            # With the lock free at once, the snapshot, if any, stays open: the store
            # takes the write lock inside it when nothing committed since
            # (SQLiteStore._commit_on). Else it ends first: another thread's commit is
            # about to make it stale, and a snapshot held while waiting would hold up a
            # WAL restart that waits for old readers (while the thread it waits for
            # waits for that restart).
            if not store._write_lock.acquire(blocking=False):
                if conn.in_transaction:
                    conn.execute("COMMIT")
                if not store._write_lock.acquire(timeout=store._busy_timeout_s):
                    # Another thread of this process has been committing for that long.
                    raise StoreBusy(store.url, store.busy_timeout_ms)
            try:
                version = store._commit_on(conn, request)
            finally:
                store._write_lock.release()
            store.checkpointer.committed()
            return version, 0
        except sqlite3.Error as err:
            raise _translate(err, "commit", store.url) from err
        finally:
            store._release(conn)

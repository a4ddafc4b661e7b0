"""The SQLite store's connections: opening one, the per-process pool, and checking (or
creating) the schema when a store opens."""

from __future__ import annotations

import os
import sqlite3
import time
from urllib.parse import quote

from quickzones.backends.sqlite.errors import _is_busy, _is_full, _is_not_a_database, _translate
from quickzones.backends.sqlite.sql import _QUICK_TABLES, _SCHEMA, add_function
from quickzones.backends.sqlite.state import _BUSY_SLICE_S, SQLiteStoreState, process_id
from quickzones.backends.sqlite.wal import WAL_CHECKPOINT_BYTES
from quickzones.errors import NotAQuickStore, StorageError, StoreBusy, StoreNotFound
from quickzones.store.kv import DATABASE_LOCKED, KVError

_POOL_SIZE = 16


class SQLiteConnections(SQLiteStoreState):
    """Connections of one store: pooled per process, never shared between threads."""

    def _connect(self, uri: str | None = None) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        if uri is None:
            # Never create the file once open: a file deleted under this process is
            # reported (StoreLost), not silently replaced by an empty store.
            uri = f"file:{quote(self._file.path)}?mode=rw"
            self._file.check(now=True)
        try:
            conn = sqlite3.connect(
                uri,
                uri=True,
                # SQLite's own busy handler sleeps in steps of 1 ms growing to 100 ms,
                # which makes a latency tail whenever another process holds the lock:
                # it covers a few ms of other statements' waits; the write lock is taken
                # with it off, polled finely (_begin_immediate).
                timeout=_BUSY_SLICE_S,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # a connection follows its transaction
                cached_statements=256,
            )
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            add_function(conn)  # the resolver's atomic adds (sql._ADD)
            # Checkpoints run on the checkpointer's thread, never inside a commit.
            conn.execute("PRAGMA wal_autocheckpoint=0")
            # The WAL file is reused after a restart, not shrunk; trimmed past this.
            conn.execute(f"PRAGMA journal_size_limit={2 * WAL_CHECKPOINT_BYTES}")
        except sqlite3.Error as err:
            if conn is not None:
                conn.close()
            if _is_not_a_database(err):
                raise NotAQuickStore(self.url, "it is not an SQLite database") from err
            if _is_busy(err):
                # Another process is switching a new file to WAL: retryable (1038).
                raise _translate(err, "connect", self.url) from err
            self._file.check(now=True)  # deleted meanwhile: StoreLost
            raise StorageError(f"cannot open sqlite database {self.path!r}: {err}") from err
        return conn

    def _acquire(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        self._file.check()  # the file opened is still the one at the path (StoreLost)
        if process_id() != self._pid:
            self._forget_inherited_connections()
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return self._connect()

    def _release(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                conn.close()
                return
        with self._lock:
            if not self._closed and len(self._pool) < _POOL_SIZE and process_id() == self._pid:
                self._pool.append(conn)
                return
        conn.close()

    def _forget_inherited_connections(self) -> None:
        with self._lock:
            self._inherited.extend(self._pool)
            self._pool = []
            self._pid = os.getpid()

    def _open_schema(self, create: bool) -> None:
        """Check the file is a quick store; with ``create``, make it one if it is not.

        An existing quick store is only read here (no write lock, so many processes can
        open one file at once). Creating the schema takes the write lock; processes that
        race to create one file wait for each other within ``busy_timeout_ms``.
        """
        if not create and not os.path.exists(self.path):
            raise StoreNotFound(self.url)
        deadline = time.monotonic() + self._busy_timeout_s
        pause = 0.001
        while True:
            try:
                if self._schema_ready(create):
                    return
            except (sqlite3.OperationalError, StoreBusy, KVError) as err:
                busy = isinstance(err, StoreBusy) or (
                    isinstance(err, KVError) and err.code == DATABASE_LOCKED
                )
                if isinstance(err, sqlite3.OperationalError):
                    if _is_full(err):
                        raise _translate(err, "open", self.url) from err
                    busy = _is_busy(err)
                if not busy:
                    raise StorageError(f"cannot open sqlite database {self.path!r}: {err}") from err
                if time.monotonic() >= deadline:
                    raise StoreBusy(self.url, self.busy_timeout_ms) from err
                time.sleep(pause * (0.5 + self._random()))
                pause = min(pause * 2, 0.05)

    def _schema_ready(self, create: bool) -> bool:
        """One attempt of :meth:`_open_schema`; raises SQLite's busy errors to retry."""
        uri = f"file:{quote(os.path.abspath(self.path))}?mode={'rwc' if create else 'rw'}"
        conn = self._connect(uri)
        try:
            tables = self._quick_tables(conn)
            if tables == _QUICK_TABLES and _journal_mode(conn) == "wal":
                self._release(conn)
                return True
            if not create:
                missing = ", ".join(sorted(_QUICK_TABLES - tables))
                reason = f"it has no {missing} table" if missing else "it is not in WAL mode"
                raise NotAQuickStore(self.url, reason)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageError(f"cannot switch {self.path!r} to WAL (journal_mode={mode})")
            self._begin_immediate(conn)
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return True

    def _quick_tables(self, conn: sqlite3.Connection) -> frozenset[str]:
        """Which of quick's tables the file has (a read: takes no write lock)."""
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        except sqlite3.DatabaseError as err:
            if _is_not_a_database(err):
                raise NotAQuickStore(self.url, "it is not an SQLite database") from err
            raise
        return frozenset(str(name) for (name,) in rows) & _QUICK_TABLES


def _journal_mode(conn: sqlite3.Connection) -> str:
    """The file's journal mode; reading it changes nothing."""
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()

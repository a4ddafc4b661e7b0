"""Transactions of SQL statements of the store's own tables beside ``kv`` (the native SQL
zones, :mod:`quickzones.store.sql`): a pooled connection holding the file's write lock
from its first statement (``BEGIN IMMEDIATE``, so the statements run one writer at a time
and need no row locks: docs/backends.md, "Zones native in SQL"), or a read snapshot. The
backend knows nothing of what the statements say; errors come back as the KV store's."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator

from quickzones.backends._ranges import encode_ranges
from quickzones.backends.sqlite.checkpointer import Checkpointer
from quickzones.backends.sqlite.connections import SQLiteConnections
from quickzones.backends.sqlite.errors import _translate
from quickzones.backends.sqlite.sql import _BUMP_VERSION, _RECORD_CONFLICTS, _VERSION, blob
from quickzones.backends.txnbuffer import VERSIONS_PER_SECOND
from quickzones.errors import StoreBusy
from quickzones.store.sql.connections import SQLTransaction

_NO_RANGES = blob(encode_ranges([]))


class _Writer(threading.local):
    """Whether this thread is inside :meth:`NativeTransactions.sql_write`."""

    inside = False


class NativeTransactions(SQLiteConnections):
    """``sql_write`` and ``sql_read``: :class:`~quickzones.store.sql.SQLConnections`."""

    _writer = _Writer()

    checkpointer: Checkpointer
    sql_dialect = "sqlite"
    sql_namespace = ""  # the file's main database

    @contextlib.contextmanager
    def sql_write(self) -> Iterator[sqlite3.Connection]:
        """A connection holding the write lock; what the block ran commits when it ends,
        nothing when it raises."""
        conn = self._acquire()
        try:
            # Threads of this process queue on the store's lock, not in SQLite's busy
            # handler (sqlite.transaction: its sleeps make a latency tail).
            if not self._write_lock.acquire(timeout=self._busy_timeout_s):
                raise StoreBusy(self.url, self.busy_timeout_ms)
            try:
                self._begin_immediate(conn)
                self._writer.inside = True
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                self._writer.inside = False
                self._write_lock.release()
            self.checkpointer.committed()
        except sqlite3.Error as err:
            raise _translate(err, "sql", self.url) from err
        finally:
            self._release(conn)

    @contextlib.contextmanager
    def sql_schema(self) -> Iterator[sqlite3.Connection]:
        """As :meth:`sql_write`: its write lock is the whole file's."""
        with self.sql_write() as conn:
            yield conn

    @contextlib.contextmanager
    def sql_write_one(self) -> Iterator[sqlite3.Connection]:
        """As :meth:`sql_write`: on one file a statement's own transaction would take
        the same write lock, with SQLite's coarser busy handler."""
        with self.sql_write() as conn:
            yield conn

    @contextlib.contextmanager
    def sql_on(self, connection: object) -> Iterator[SQLTransaction]:
        """The application's own connection to this file, in its open transaction,
        which holds the file's write lock from here on (``app_transaction.join``; a
        transaction is begun where none is open): the native zones' statements run in
        it, so the application's COMMIT commits them with its rows and its ROLLBACK
        neither. Every KV transaction this thread makes meanwhile joins it too (as in
        :meth:`transaction_on`): the enqueue-rate charge, the steady clock's exchange.
        Work handed to the transaction's ``after_commit`` runs when the block ends:
        SQLite tells nobody of another connection's COMMIT, and the application's write
        lock keeps every other writer out until then (what runs there is the local
        consumers' wake-up, which finds the item at their next scan after the COMMIT)."""
        from quickzones.backends.sqlite.app_transaction import join

        conn, began = join(self, connection)  # type: ignore[arg-type]
        previous = self._bound.conn  # type: ignore[attr-defined]
        self._bound.conn = conn  # type: ignore[attr-defined]
        tr = SQLTransaction(conn, self)
        try:
            yield tr
        except BaseException as err:
            if began and conn.in_transaction:
                # Nothing of the application's is in the transaction this call opened.
                conn.rollback()
            if isinstance(err, sqlite3.Error):
                raise _translate(err, "enqueue_on", self.url) from err
            raise
        finally:
            self._bound.conn = previous  # type: ignore[attr-defined]
        tr.committed()

    @contextlib.contextmanager
    def sql_read(self) -> Iterator[sqlite3.Connection]:
        """A connection outside any transaction: each statement reads a snapshot of its
        own (a read of one statement needs no BEGIN and no ROLLBACK)."""
        conn = self._acquire()
        try:
            yield conn
        except sqlite3.Error as err:
            raise _translate(err, "sql read", self.url) from err
        finally:
            self._release(conn)

    def joins_application_here(self) -> bool:
        """Whether this thread is inside :meth:`sql_write`: a KV transaction it made now
        would wait for the write lock it holds, so work that can wait (the steady
        clock's floor exchange, :func:`quickzones.store.kv.joins_application_here`)
        waits for a later moment."""
        return self._writer.inside

    def relax_durability(self, conn: sqlite3.Connection) -> None:
        """Nothing: in WAL mode with ``synchronous=NORMAL`` no commit waits for a flush."""

    def signal_commit(self, conn: sqlite3.Connection) -> None:
        """Make the transaction on ``conn`` a commit that wakes idle consumers elsewhere,
        as a KV commit does: a commit version of its own with no conflict ranges (KV
        transactions never read these tables), which other store objects' commit
        watchers (``data_version``) count."""
        version: int = conn.execute(_VERSION).fetchone()[0]
        version = max(version + 1, int(self.clock.now() * VERSIONS_PER_SECOND))
        conn.execute(_RECORD_CONFLICTS, (version, _NO_RANGES))
        conn.execute(_BUMP_VERSION, (version,))
        self._foreign.made(version)

"""Transactions of SQL statements of the store's own tables beside ``kv`` (the native SQL
zones, :mod:`quickzones.store.sql`, ``postgresql://...?zones=sql``): a pooled connection in
a transaction at READ COMMITTED, where the statements' row locks order the writers of one
row (docs/backends.md, "Zones native in SQL"), or outside one. The backend knows nothing of
what the statements say; errors come back as the KV store's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import psycopg

from quickzones.backends.postgres import wire
from quickzones.backends.postgres.errors import translate
from quickzones.backends.postgres.native_session import WireSession
from quickzones.store.sql.connections import SQLConnections, SQLTransaction

if TYPE_CHECKING:
    from quickzones.backends.postgres.store import PostgresStore


class _Unprepared:
    """The application's connection as the native zones' statements use it: each one
    unprepared, whatever the connection's ``prepare_threshold`` (psycopg's default
    prepares a statement on its fifth run, on one server session; behind PgBouncer before
    1.21 the application's next transaction runs on another, which has none)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, query: str, params: Any = None) -> Any:
        return self._conn.execute(query, params, prepare=False)


class NativeTransactions:
    """``sql_write``, ``sql_read`` and ``signal_commit``:
    :class:`~quickzones.store.sql.SQLConnections` over a :class:`PostgresStore`."""

    sql_dialect = "postgres"

    @property
    def sql_namespace(self: PostgresStore) -> str:  # type: ignore[misc]
        """Where the native tables live: the store's schema, quoted."""
        return '"' + self.schema.replace('"', '""') + '".'

    @contextlib.contextmanager
    def sql_write(self: PostgresStore) -> Iterator[Any]:  # type: ignore[misc]
        """A connection in a transaction for the block: what the block ran commits when it
        ends, nothing when it raises."""
        conn = self._acquire()
        try:
            try:
                # Pipelined: BEGIN goes with the block's first statement and COMMIT with
                # its last writes, each batch in one round trip (a statement's result is
                # waited for only when the block reads it).
                session = WireSession(conn)
                session.execute("BEGIN")
                yield session
                session.execute("COMMIT")
                session.flush()
            except BaseException:
                idle = psycopg.pq.TransactionStatus.IDLE
                if not conn.closed and conn.info.transaction_status != idle:
                    conn.execute("ROLLBACK")
                raise
        except psycopg.Error as err:
            raise translate(err, "sql", self.shown) from err
        finally:
            self._release(conn)

    @contextlib.contextmanager
    def sql_schema(self: PostgresStore) -> Iterator[Any]:  # type: ignore[misc]
        """:meth:`sql_write` holding the schema's advisory lock (``store._SCHEMA_LOCK``,
        which the KV tables' creation and migration take too)."""
        from quickzones.backends.postgres.store import _SCHEMA_LOCK

        with self.sql_write() as conn:
            conn.execute(_SCHEMA_LOCK, (self.schema,))
            yield conn

    @contextlib.contextmanager
    def sql_write_one(self: PostgresStore) -> Iterator[Any]:  # type: ignore[misc]
        """A connection for writes that are each a transaction of their own (autocommit):
        one round trip a statement, no BEGIN nor COMMIT."""
        with self.sql_read() as conn:
            yield conn

    @contextlib.contextmanager
    def sql_on(self: PostgresStore, connection: object) -> Iterator[SQLTransaction]:  # type: ignore[misc]
        """The application's own connection to this database, in its open transaction
        (``app_transaction.join``: the same checks as the KV layout's): the native zones'
        statements run in it, so the application's COMMIT commits them with its rows and
        its ROLLBACK neither. What they hold until then is the zone's pointer row FOR KEY
        SHARE. Work handed to the transaction's ``after_commit`` (part two) runs on the
        store's after-commit thread once the server says that transaction committed
        (never if it rolls back); no KV transaction of this thread joins it."""
        from quickzones.backends.postgres.app_transaction import join

        joined = join(self, connection)
        during = "enqueue into the application's transaction"
        # Unprepared either way: an application's session is its own (and behind a pooler
        # its next transaction may run on another); through wire.py where the connection
        # allows it, for the binary parameters and one write a round trip.
        session = WireSession(joined.conn) if wire.usable(joined.conn) else None
        tr = SQLTransaction(
            _Unprepared(joined.conn) if session is None else session, cast("SQLConnections", self)
        )
        try:
            yield tr
            if session is not None:
                session.flush()
            work = tr.take_after()
            if not work:
                return
            xid = tr.app_txid
            if xid is None:
                row = joined.conn.execute(
                    "SELECT pg_current_xact_id()::text", prepare=False
                ).fetchone()
                xid = str(row[0]) if row is not None else None
        except psycopg.Error as err:
            raise translate(err, during, self.shown) from err
        if xid is not None:
            self.after_commit.add(xid, work, [])

    @contextlib.contextmanager
    def sql_read(self: PostgresStore) -> Iterator[Any]:  # type: ignore[misc]
        """A connection outside any transaction: each statement reads a snapshot of its own."""
        conn = self._acquire()
        try:
            session = WireSession(conn)
            yield session
            session.flush()  # writes whose answer the block did not read
        except psycopg.Error as err:
            raise translate(err, "sql read", self.shown) from err
        finally:
            self._release(conn)

    def relax_durability(self: PostgresStore, conn: Any) -> None:  # type: ignore[misc]
        """The transaction on ``conn`` commits without waiting for the log's flush (a
        visit's writes: a crash of the server puts them back, and the items run again)."""
        conn.execute("SET LOCAL synchronous_commit = off")

    def signal_commit(self: PostgresStore, conn: Any) -> None:  # type: ignore[misc]
        """Make the transaction on ``conn`` a commit that wakes idle consumers elsewhere, as
        a KV commit that made a pointer vest earlier does: a row in ``quick_log`` with no
        conflict ranges (the commit watchers' count, ``data_version``) and a NOTIFY on the
        schema's channel (sent at COMMIT)."""
        row = conn.execute(self.sql.native_commit, self.sql.notify_args).fetchone()
        self.foreign.made(int(row[0]))

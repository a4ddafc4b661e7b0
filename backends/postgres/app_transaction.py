"""Quick's writes inside the application's own PostgreSQL transaction (issue 30 point 2).

An application whose tables live in the same database enqueues through its own connection
(``Quick.enqueue_on(conn, ...)``, or :meth:`PostgresStore.transaction_on`): the item, its
pointer and the store's version bookkeeping are written into the application's open
transaction, so its COMMIT commits its rows and the item together and its ROLLBACK (or a
crash, or a dropped connection before COMMIT) leaves neither.

How it keeps the store's rules (``docs/fdb-semantics.md``):

* The application's transaction takes the resolver's lock (the ``quick_meta`` row,
  ``FOR UPDATE``) in quick's first round trip through it, pipelined before that first
  read (:func:`join` only checks the connection). The server runs them in order, so from
  then until the application commits or rolls back no other quick commit can happen, and
  what an :class:`AppTransaction` reads is the newest state and cannot be invalidated: it
  needs no optimistic check and never aborts.
  Other quick commits wait for the lock up to the store's ``lock_timeout_ms``: keep the
  transaction short after enqueueing.
* At READ COMMITTED (PostgreSQL's default) each statement sees the newest commits once
  the lock is held. At REPEATABLE READ or SERIALIZABLE the application's snapshot may be
  older than the last quick commit: PostgreSQL then refuses the lock with a serialization
  failure, raised here as a retryable conflict (1020); roll back and run the transaction
  again, as for any serialization failure.
* Its commit applies the writes, records their conflict ranges under a new version and
  bumps the version inside a savepoint of the application's transaction (a failure leaves
  none of it). Quick transactions that read before the application's COMMIT and touch
  what it wrote fail with a conflict and are retried, as after any commit; pruning keeps
  a row that conflicts with every older reader, so a late COMMIT is never missed.
* Part two of the enqueue (pulling an idle pointer's vesting earlier) runs in a
  transaction of its own after a commit elsewhere; here it joins part one
  (``holds_commit_lock``: reading the pointer record cannot abort a transaction nothing
  else can commit beside), and every transaction this thread starts meanwhile joins the
  application's transaction too, so the pointer and the item can never be apart: no
  item without its pointer, and pointer collection (which must take the lock to delete)
  cannot run between them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg.pq import TransactionStatus

from quickzones.aio import OnLoop
from quickzones.backends.postgres import resolver
from quickzones.backends.postgres.async_connection import SyncOverAsync
from quickzones.backends.postgres.errors import pipeline, translate
from quickzones.backends.postgres.joined import Joined
from quickzones.backends.postgres.resolver import Connection, Rows
from quickzones.backends.postgres.sql import KEYS_PER_SELECT
from quickzones.backends.txnbuffer import BufferedTransaction, CommitRequest, KeyValue
from quickzones.errors import OtherDatabase, UnusableConnection
from quickzones.store.kv import NOT_COMMITTED, KVError

if TYPE_CHECKING:
    from quickzones.backends.postgres.store import PostgresStore

# The savepoint each commit into the application's transaction writes under, opened and
# released in the commit's own two round trips: a failure rolls back to it, leaving none
# of quick's writes and the application's transaction usable.
_SAVEPOINT = "SAVEPOINT quick_enqueue"
_RELEASE = "RELEASE SAVEPOINT quick_enqueue"
_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT quick_enqueue"


_STALE_SNAPSHOT = (
    "the application's transaction reads a snapshot older than the last quick commit;"
    " roll it back and run it again"
)
# The read version of an application transaction whose lock its first read will take.
_PENDING = -1
# The server and database a connection reaches, however it connected (TCP or socket).
_WHERE = "SELECT current_database(), current_setting('port')"


def dbapi_connection(connection: object) -> Connection:
    """The psycopg ``Connection`` behind what the application passed: itself (or, from
    :meth:`AsyncQuick.enqueue_on`, an ``AsyncConnection`` driven on its loop), a
    SQLAlchemy ``Connection`` or ``Session`` (its connection's ``driver_connection``) or
    Django's ``django.db.connection`` (its ``.connection``, opened if need be)."""
    if isinstance(connection, psycopg.Connection):
        return connection
    if isinstance(connection, OnLoop):
        held = connection.connection
        if isinstance(held, psycopg.AsyncConnection):
            # AsyncQuick.enqueue_on: this thread sends, the application's loop runs.
            return cast(Connection, SyncOverAsync(held, connection.loop))
        connection = held
    if isinstance(connection, psycopg.AsyncConnection):
        raise UnusableConnection(
            "a psycopg AsyncConnection",
            "use AsyncQuick.enqueue_on, which drives it from the event loop",
        )
    candidate: Any = connection
    if callable(getattr(candidate, "ensure_connection", None)):  # Django's wrapper
        candidate.ensure_connection()
    elif callable(getattr(candidate, "get_bind", None)) and callable(
        getattr(candidate, "connection", None)
    ):  # a SQLAlchemy Session: the Connection of its current transaction
        candidate = candidate.connection()
    inner: Any = getattr(candidate, "connection", None)
    driver = getattr(inner, "driver_connection", inner)  # SQLAlchemy's pool proxy
    if isinstance(driver, psycopg.Connection):
        return driver
    raise UnusableConnection(
        type(connection).__name__,
        "expected a psycopg Connection, a SQLAlchemy Connection or Session (postgresql+psycopg)"
        " or Django's connection to the store's database",
    )


def join(store: PostgresStore, connection: object) -> Joined:
    """Check the application's connection; its transaction takes the resolver's lock with
    the first read through it (:meth:`AppTransaction._locked`). Raises
    :class:`UnusableConnection` (not psycopg, closed, another database, autocommit, a
    failed transaction)."""
    conn = dbapi_connection(connection)
    if conn.closed or conn.broken:
        raise UnusableConnection("the application's connection", "it is closed")
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise UnusableConnection(
            "the application's connection", "its transaction failed; roll it back first"
        )
    if status == TransactionStatus.IDLE and conn.autocommit:
        raise UnusableConnection(
            "the application's connection",
            "it is in autocommit mode with no transaction open, so the item would commit"
            " on its own; use conn.transaction() (or BEGIN) first",
        )
    try:
        if conn not in store.same_database:
            where = conn.execute(_WHERE).fetchone()
            if where != store.server_identity(_WHERE):
                raise OtherDatabase(
                    f"a connection to database {where[0] if where else '?'!r}",
                    "the store's schema lives in another database; connect to the store's",
                )
            store.same_database.add(conn)
    except psycopg.Error as err:
        raise translate(err, "joining the application's transaction", store.shown) from err
    return Joined(conn)


class AppTransaction(BufferedTransaction):
    """A KV transaction on a :class:`PostgresStore` whose reads and commit go through the
    application's connection, inside its open transaction (which holds the resolver's
    lock, see :func:`join`). Its commit writes into that transaction; the application's
    COMMIT makes it durable. It never conflicts."""

    # Its connection's transaction holds the store's commit lock (see join()).
    holds_commit_lock = True

    def __init__(self, store: PostgresStore, joined: Joined) -> None:
        self._store = store
        self._joined = joined
        self._conn = joined.conn
        super().__init__(store.clock)

    def _checked(self) -> Connection:
        if self._joined.stale_snapshot:
            # Said again to every quick call in it (one that swallowed it, such as the
            # steady clock's, left the application's transaction failed all the same).
            raise KVError(NOT_COMMITTED, _STALE_SNAPSHOT)
        if self._conn.info.transaction_status != TransactionStatus.INTRANS:
            raise UnusableConnection(
                "the application's connection",
                "its transaction ended (committed, rolled back or failed) while quick was"
                " writing into it",
            )
        return self._conn

    def _acquire_read_version(self) -> int:
        self._checked()
        if self._joined.version is None:
            # Not locked yet: the read that follows takes the lock in its round trip and
            # sets the read version to the lock's (_locked); read_version() alone locks.
            return _PENDING
        return self._joined.version  # the lock is held: the newest version, no round trip

    def get_read_version(self) -> int:
        if self._joined.version is None:
            self._locked("read version", "SELECT 1", ())
        return super().get_read_version()

    def _locked(self, what: str, sql: str, params: Sequence[Any]) -> Rows:
        """``sql``'s rows, read under the resolver's lock: taken first, in the same
        round trip, if this application transaction does not hold it yet."""
        conn = self._checked()
        joined = self._joined
        try:
            if joined.version is not None:
                return conn.execute(sql, params)
            with pipeline(conn):
                lock = conn.execute(self._store.sql.join_lock)
                rows = conn.execute(sql, params)
            row = lock.fetchone()
        except psycopg.errors.SerializationFailure as err:
            joined.stale_snapshot = True
            raise KVError(NOT_COMMITTED, _STALE_SNAPSHOT) from err
        except psycopg.Error as err:
            raise translate(err, what, self._store.shown) from err
        assert row is not None, "quick_meta has its row"
        joined.version = int(row[0])
        self._read_version = joined.version
        if isinstance(conn, psycopg.Connection):  # not an AsyncConnection driven from here
            self._store.held_here(conn, str(row[1]))
        return rows

    def _read_key(self, key: bytes) -> bytes | None:
        self._check_too_old(self._clock.now())
        row = self._locked("get", self._store.sql.get, (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._check_too_old(self._clock.now())
        found: dict[bytes, bytes] = {}
        for at in range(0, len(keys), KEYS_PER_SELECT):
            chunk = list(keys[at : at + KEYS_PER_SELECT])
            rows = self._locked("get_many", self._store.sql.get_many, (chunk,)).fetchall()
            found.update((bytes(k), bytes(v)) for k, v in rows)
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        self._check_too_old(self._clock.now())
        sql = self._store.sql.range_reverse if reverse else self._store.sql.range
        rows = self._locked("get_range", sql + " LIMIT %s", (begin, end, limit or None))
        return [(bytes(k), bytes(v)) for k, v in rows.fetchall()]

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        conn = self._checked()
        if self._joined.version is None:
            # Nothing was read (every read takes the lock first), so nothing to check:
            # the resolver takes the lock itself.
            request.read_version = None
        try:
            version = resolver.apply(
                conn,
                self._store.sql,
                request,
                self._clock.now(),
                begin=(_SAVEPOINT,),
                end=(_RELEASE,),
                end_commits=False,
                undo=(_ROLLBACK_TO, _RELEASE),
                again=(_SAVEPOINT,),
            )
        except BaseException as err:
            self._roll_back_to_savepoint(conn)
            if isinstance(err, psycopg.Error):
                raise translate(
                    err, "commit into the application's transaction", self._store.shown
                ) from err
            raise
        self._joined.version = version
        return version, 0

    @staticmethod
    def _roll_back_to_savepoint(conn: Connection) -> None:
        """Undo a failed commit's writes, leaving the application's transaction as it was
        (and usable, if a statement failed); a connection already lost stays lost."""
        if conn.broken or conn.closed:
            return
        status = conn.info.transaction_status
        if status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            return
        with contextlib.suppress(psycopg.Error):
            conn.execute(_ROLLBACK_TO)
            conn.execute(_RELEASE)

    def _random(self) -> float:
        return self._store._random()

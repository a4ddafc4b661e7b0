"""Quick's writes inside the application's own PostgreSQL transaction (issue 30 point 2).

An application whose tables live in the same database enqueues through its own connection
(``Quick.enqueue_on(conn, ...)``, or :meth:`PostgresStore.transaction_on`): the item, its
pointer and the store's version bookkeeping are written into the application's open
transaction, so its COMMIT commits its rows and the item together and its ROLLBACK (or a
crash, or a dropped connection before COMMIT) leaves neither.

How it keeps the store's rules (``docs/fdb-semantics.md``) without stopping anyone else:

* quick's first read through the application's connection also asks, in the same round
  trip, the transaction's id, the snapshot that read sees and its isolation level;
* its commit takes the advisory locks of the keys it read and wrote (``locks.py``), checks
  that no commit that snapshot did not see wrote what it read, and writes, inside a
  savepoint of the application's transaction (a failure leaves none of it). The locks last
  until the application commits or rolls back: only commits touching the same keys wait
  for it (an enqueue's are its zone's index entry, shared with other enqueues into the
  zone, the keys of its own item and a shard of the zone's count,
  ``sharded_counts``); a commit that read single keys only locks its single-key writes
  alone (``locks.plan(held_long=True)``), so neither consumers of its own zone nor other
  tenants' enqueues ever wait for it. Its row in ``quick_log`` carries the application's
  transaction id, so readers that did not see its COMMIT fail and retry, as after any
  commit;
* at READ COMMITTED (PostgreSQL's default) a conflict found by that check is retried
  inside the application's transaction (each statement sees the newest commits); at
  REPEATABLE READ or SERIALIZABLE the application's snapshot is older than the commit
  that conflicts, so the application must roll back and run again: a retryable conflict
  (1020) is raised, and again to every quick call in that transaction;
* part two of the enqueue (pulling an idle pointer's vesting earlier) runs after the
  application's COMMIT, reading the pointer once commits in flight on it have ended
  (:meth:`AppTransaction.read_after_commit`), in a transaction of its own
  (``after_commit.py``), so the application never holds the pointer record that
  consumers lease; and the application's COMMIT sends no NOTIFY (whose global queue
  lock every notifying COMMIT takes): idle consumers hear of it from the commit log they
  poll, or from part two's commit.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg.pq import TransactionStatus

from quickzones.aio import OnLoop
from quickzones.backends.postgres import resolver, wire
from quickzones.backends.postgres.after_commit import SettledRead
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
log = logging.getLogger(__name__)

_SAVEPOINT = "SAVEPOINT quick_enqueue"
_RELEASE = "RELEASE SAVEPOINT quick_enqueue"
_ROLLBACK_TO = "ROLLBACK TO SAVEPOINT quick_enqueue"


_STALE_SNAPSHOT = (
    "the application's transaction reads a snapshot older than the last quick commit;"
    " roll it back and run it again"
)
# The read version of an application transaction until its first read brings it.
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
    """Check the application's connection (quick's first read through it asks for its
    transaction's id and snapshot: :meth:`AppTransaction._read`). Raises
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
            where = conn.execute(_WHERE, prepare=False).fetchone()
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
    application's connection, inside its open transaction (see the module's notes). Its
    commit writes into that transaction; the application's COMMIT makes it durable."""

    # run() may not retry it unless the application's transaction can read newer
    # commits (can_retry_in_place): only the application can roll it back.
    joins_application = True

    def __init__(self, store: PostgresStore, joined: Joined) -> None:
        self._store = store
        self._joined = joined
        self._conn = joined.conn
        # The snapshot this try's first read saw (pg_snapshot's text); None: not read.
        self._seen: str | None = None
        # Its commit made a zone's pointer vest earlier (kv.wake_watchers): idle
        # consumers elsewhere are notified once the application commits.
        self._wakes_after = False
        # What part two reads after the COMMIT (read_after_commit): the store's thread
        # reads them with the other transactions' that committed in the same round.
        self._settled: list[SettledRead] = []
        super().__init__(store.clock)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._settled = []  # a retried try's reads go with its callbacks

    def can_retry_in_place(self, error: KVError) -> bool:
        """Whether run() may try again inside the application's transaction: a conflict
        at READ COMMITTED (the next try reads newer commits), nothing else."""
        return (
            error.code == NOT_COMMITTED
            and self._joined.read_committed
            and (not self._joined.stale_snapshot)
        )

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
        self._seen = None
        return _PENDING  # the first read brings it (_read)

    def get_read_version(self) -> int:
        if self._seen is None:
            self._read("read version", wire.plain("SELECT 1"), "SELECT 1", ())
        return super().get_read_version()

    def _read(self, what: str, statement: wire.Statement, sql: str, params: Sequence[Any]) -> Rows:
        """A read (``statement`` for :mod:`.wire` on a blocking psycopg connection, else
        ``sql`` with ``params`` for psycopg); the first read of a try also brings, in the
        same round trip, the application's transaction id, the snapshot it reads in, its
        isolation level and the last commit version."""
        conn = self._checked()
        joined = self._joined
        direct = wire.usable(conn)
        info: Rows
        rows: Rows
        try:
            if self._seen is not None:
                if direct:
                    return wire.exchange(conn, (statement,))[0]
                return conn.execute(sql, params, prepare=False)
            if direct:
                xact = wire.plain(self._store.sql.application_xact)
                info, rows = wire.exchange(conn, (xact, statement))
                row = info.fetchone()
                row = None if row is None else tuple(v.decode() for v in row)
            else:
                with pipeline(conn):
                    info = conn.execute(self._store.sql.application_xact, prepare=False)
                    rows = conn.execute(sql, params, prepare=False)
                row = info.fetchone()
        except psycopg.Error as err:
            raise translate(err, what, self._store.shown) from err
        assert row is not None, "a transaction has an id and a snapshot"
        joined.xid, self._seen = str(row[0]), str(row[1])
        joined.read_committed = row[2] == "read committed"
        self._read_version = int(row[3])
        if isinstance(conn, psycopg.Connection):  # not an AsyncConnection driven from here
            self._store.held_here(conn, joined.xid)
        return rows

    def _read_key(self, key: bytes) -> bytes | None:
        self._check_too_old(self._clock.now())
        sql = self._store.sql
        statement = (sql.wire["get"], (wire.bytea(key),), True)
        row = self._read("get", statement, sql.get, (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._check_too_old(self._clock.now())
        sql = self._store.sql
        found: dict[bytes, bytes] = {}
        for at in range(0, len(keys), KEYS_PER_SELECT):
            chunk = list(keys[at : at + KEYS_PER_SELECT])
            statement = (sql.wire["get_many"], (wire.byteas(chunk),), True)
            rows = self._read("get_many", statement, sql.get_many, (chunk,)).fetchall()
            found.update((bytes(k), bytes(v)) for k, v in rows)
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        self._check_too_old(self._clock.now())
        sql = self._store.sql
        name = "range_reverse" if reverse else "range"
        params = (wire.bytea(begin), wire.bytea(end), wire.int8(limit or None))
        text = (sql.range_reverse if reverse else sql.range) + " LIMIT %s"
        statement = (sql.wire[name], params, True)
        rows = self._read("get_range", statement, text, (begin, end, limit or None))
        return [(bytes(k), bytes(v)) for k, v in rows.fetchall()]

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        conn = self._checked()
        if self._seen is None:
            request.read_version = None  # nothing was read: nothing to check
        try:
            version = resolver.apply(
                conn,
                self._store.sql,
                request,
                self._clock.now(),
                snapshot=self._seen,
                space=self._store.lock_space,
                begin=(_SAVEPOINT,),
                end=(_RELEASE,),
                end_commits=False,
                undo=(_ROLLBACK_TO, _RELEASE),
                again=(_SAVEPOINT,),
                held_long=True,
            )
        except BaseException as err:
            self._roll_back_to_savepoint(conn)
            if isinstance(err, KVError) and err.code == NOT_COMMITTED:
                if not self._joined.read_committed:
                    self._joined.stale_snapshot = True
                    raise KVError(NOT_COMMITTED, _STALE_SNAPSHOT) from err
                raise
            if isinstance(err, psycopg.errors.SerializationFailure):
                self._joined.stale_snapshot = True
                raise KVError(NOT_COMMITTED, _STALE_SNAPSHOT) from err
            if isinstance(err, psycopg.Error):
                raise translate(
                    err, "commit into the application's transaction", self._store.shown
                ) from err
            raise
        self._wakes_after = self._wakes_after or request.wakes_watchers
        return version, 0

    def read_after_commit(self, keys: Sequence[bytes]) -> Callable[[], list[bytes | None] | None]:
        """The values of ``keys`` read once the application's transaction has committed,
        asked by what follows that COMMIT (part two, on the store's after-commit thread:
        :meth:`_run_on_commit`), never before; they wait for commits in flight on those
        keys (:meth:`PostgresStore.read_settled`). None if the read failed."""
        read = SettledRead(keys)
        self._settled.append(read)
        store = self._store

        def values() -> list[bytes | None] | None:
            if read.values is not None:  # read with the round's others
                return read.values
            try:
                return store.read_settled(read.keys)
            except Exception as err:  # part two then reads in its own transaction
                log.debug("a read after an application's commit failed: %s", err)
                return None

        return values

    def _run_on_commit(self) -> None:
        # Its commit is only into the application's transaction: what waits for the
        # commit (part two of an enqueue, the NOTIFY for a pointer it made vest earlier)
        # waits for the application's COMMIT, and runs on a thread of the store's: the
        # application's COMMIT never takes NOTIFY's global lock.
        callbacks, self._on_commit = self._on_commit, []
        reads, self._settled = self._settled, []
        if self._wakes_after:
            self._wakes_after = False
            callbacks.append(self._store.notify_commit)
        if not callbacks:
            return
        xid = self._joined.xid
        if xid is None:
            try:
                row = (
                    self._checked()
                    .execute("SELECT pg_current_xact_id()::text", prepare=False)
                    .fetchone()
                )
            except psycopg.Error:
                return  # best effort, as part two is everywhere
            xid = self._joined.xid = str(row[0]) if row else None
        if xid is not None:
            self._store.after_commit.add(xid, callbacks, reads)

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
            conn.execute(_ROLLBACK_TO, prepare=False)
            conn.execute(_RELEASE, prepare=False)

    def _random(self) -> float:
        return self._store._random()

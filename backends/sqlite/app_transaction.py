"""Quick's writes inside the application's own SQLite transaction (issue 15 point 6).

An application keeping its tables in the store's file enqueues through its own connection
(``Quick.enqueue_on(conn, ...)``, or :meth:`SQLiteStore.transaction_on`): the item, its
pointer and the store's version bookkeeping are written into the application's open
transaction, so the application's COMMIT commits its rows and the item together and its
ROLLBACK (or a crash before COMMIT) leaves neither.

How it keeps the store's rules (``docs/fdb-semantics.md``):

* :func:`join` first makes the application's transaction hold SQLite's write lock (a
  no-op write to ``quick_meta``; ``BEGIN IMMEDIATE`` if no transaction is open yet). From
  then until the application commits or rolls back, no other commit can happen, so the
  reads an :class:`AppTransaction` makes see the newest state and can never be
  invalidated: it needs no optimistic check and never aborts. Other writers (consumers,
  other producers) wait for the lock, exactly as for any SQLite writer, up to their
  ``busy_timeout_ms``, then fail with ``StoreBusy``: keep the transaction short.
* Its commit applies the writes, records their write conflict ranges under a new version
  and bumps the version, all in the application's transaction (inside a savepoint, so a
  failure leaves none of it). Quick transactions that read before the application's
  COMMIT and touch what it wrote fail with a conflict (1020) and are retried, as after
  any other commit. The version is taken when the enqueue is written; if the application
  commits much later, the pruning of old conflict rows keeps a row that conflicts with
  every older reader, so no such reader misses it.
* Part two of the enqueue (pulling an idle pointer's vesting earlier) normally runs in a
  transaction of its own after the commit; here every transaction this thread starts
  meanwhile joins the application's transaction, so part two commits with it too.
  Reading the pointer record there cannot abort the application's transaction (invariant
  3's concern), because nothing can commit while it holds the lock.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from typing import Any

from quickzones.backends.sqlite.errors import _is_busy, _translate
from quickzones.backends.sqlite.sql import _GET, _RANGE, _RANGE_REVERSE, _VERSION, blob
from quickzones.backends.sqlite.store import SQLiteStore
from quickzones.backends.txnbuffer import BufferedTransaction, CommitRequest, KeyValue
from quickzones.errors import OtherDatabase, StoreBusy, UnusableConnection
from quickzones.store.kv import NOT_COMMITTED, KVError

# A write that changes nothing: it makes the transaction hold SQLite's write lock.
_TAKE_WRITE_LOCK = "UPDATE quick_meta SET version = version WHERE id = 0"
_SQLITE_BUSY_SNAPSHOT = 517  # a WAL read transaction that cannot become a write one
_SAVEPOINT = "quick_enqueue"


def dbapi_connection(connection: object) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` behind what the application passed: itself, a
    SQLAlchemy ``Connection`` (its ``.connection.driver_connection``) or Django's
    ``django.db.connection`` (its ``.connection``, opened if need be)."""
    if isinstance(connection, sqlite3.Connection):
        return connection
    if callable(getattr(connection, "ensure_connection", None)):  # Django's wrapper
        connection.ensure_connection()  # type: ignore[attr-defined]
    inner: Any = getattr(connection, "connection", None)
    driver = getattr(inner, "driver_connection", inner)  # SQLAlchemy's pool proxy
    if isinstance(driver, sqlite3.Connection):
        return driver
    raise UnusableConnection(
        type(connection).__name__,
        "expected a sqlite3.Connection, a SQLAlchemy Connection or Django's connection"
        " to the store's SQLite file",
    )


def _main_file(conn: sqlite3.Connection) -> str:
    try:
        rows = conn.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as err:
        # "Cannot operate on a closed database.", or another thread's connection.
        reason = "it is closed" if "closed" in str(err) else f"it cannot be used here: {err}"
        raise UnusableConnection("the application's connection", reason) from err
    return next((str(file) for _, name, file in rows if name == "main"), "")


@functools.lru_cache(maxsize=64)
def _realpath(path: str) -> str:
    return os.path.realpath(path)


def join(store: SQLiteStore, connection: object) -> tuple[sqlite3.Connection, bool]:
    """Check the application's connection and make its transaction hold the write lock;
    returns the connection and whether this call opened its transaction (so a failure
    can close it again, leaving the connection as it was).

    Raises :class:`UnusableConnection` (not SQLite, closed, another file, autocommit with
    no transaction open), ``StoreBusy`` (another writer held the lock past the
    connection's busy timeout) or a retryable ``KVError`` 1020 (the application's
    transaction read a snapshot that another commit has since replaced: SQLite cannot
    make it a write transaction; roll it back and run it again).
    """
    conn = dbapi_connection(connection)
    main = _main_file(conn)
    expected = _realpath(store.path)
    if not main or (main != expected and _realpath(main) != expected):
        raise OtherDatabase(
            f"a connection to {main or 'an in-memory database'!r}",
            f"the store is {expected!r}; connect to the store's file",
        )
    if not conn.in_transaction:
        if conn.isolation_level is None or getattr(conn, "autocommit", None) is True:
            raise UnusableConnection(
                f"a connection to {main!r}",
                "it is in autocommit mode (isolation_level=None) with no transaction open,"
                " so the item would commit on its own; execute BEGIN first",
            )
        # Python's default mode opens a transaction before the first write anyway; open
        # it now, as a writer, so it ends with the application's conn.commit().
        _write(store, conn, "BEGIN IMMEDIATE")
        return conn, True
    _write(store, conn, _TAKE_WRITE_LOCK)
    return conn, False


def _write(store: SQLiteStore, conn: sqlite3.Connection, sql: str) -> None:
    try:
        conn.execute(sql)
    except sqlite3.OperationalError as err:
        if getattr(err, "sqlite_errorcode", 0) == _SQLITE_BUSY_SNAPSHOT:
            raise KVError(
                NOT_COMMITTED,
                "the application's transaction read the store before another commit, so"
                " SQLite cannot let it write; roll it back and run it again",
            ) from err
        if _is_busy(err):
            timeout = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
            raise StoreBusy(store.url, timeout) from err
        raise _translate(err, "joining the application's transaction", store.url) from err
    except sqlite3.Error as err:
        raise _translate(err, "joining the application's transaction", store.url) from err


class AppTransaction(BufferedTransaction):
    """A KV transaction on a :class:`SQLiteStore` whose reads and commit go through the
    application's connection, inside its open transaction (which holds the write lock,
    see :func:`join`). Its commit writes into that transaction; the application's COMMIT
    makes it durable. It never conflicts."""

    # Its connection's transaction holds the store's commit lock (see join()).
    holds_commit_lock = True

    def __init__(
        self,
        store: SQLiteStore,
        conn: sqlite3.Connection,
        *,
        version: int | None = None,
        known: dict[bytes, bytes | None] | None = None,
    ) -> None:
        """``version`` and ``known``: the store's version and values of some keys as
        ``conn`` sees them now (a commit's own, under its write lock: kv.follow_in_commit),
        so that reading them costs no statement."""
        self._store = store
        self._conn = conn
        super().__init__(store.clock)
        if version is not None:
            self._read_time = self._now()
            self._read_version = version
        if known:
            self._read_cache.update(known)

    def _checked(self) -> sqlite3.Connection:
        if not self._conn.in_transaction:
            raise UnusableConnection(
                "the application's connection",
                "its transaction ended (committed or rolled back) while quick was writing into it",
            )
        return self._conn

    def _acquire_read_version(self) -> int:
        try:
            version: int = self._checked().execute(_VERSION).fetchone()[0]
        except sqlite3.Error as err:
            raise _translate(err, "read version", self._store.url) from err
        return version

    def _read_key(self, key: bytes) -> bytes | None:
        self._check_too_old(self._now())
        try:
            row = self._checked().execute(_GET, (blob(key),)).fetchone()
        except sqlite3.Error as err:
            raise _translate(err, "get", self._store.url) from err
        return None if row is None else bytes(row[0])

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        self._check_too_old(self._now())
        sql = _RANGE_REVERSE if reverse else _RANGE
        try:
            rows = self._checked().execute(sql, (blob(begin), blob(end), limit or -1)).fetchall()
        except sqlite3.Error as err:
            raise _translate(err, "get_range", self._store.url) from err
        return [(bytes(k), bytes(v)) for k, v in rows]

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        conn = self._checked()
        try:
            conn.execute(f"SAVEPOINT {_SAVEPOINT}")
            try:
                version = self._store._apply(conn, request)
            except BaseException:
                # None of quick's writes stay in the application's transaction.
                conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
                conn.execute(f"RELEASE {_SAVEPOINT}")
                raise
            conn.execute(f"RELEASE {_SAVEPOINT}")
        except sqlite3.Error as err:
            raise _translate(
                err, "commit into the application's transaction", self._store.url
            ) from err
        return version, 0

    def _random(self) -> float:
        return self._store._random()

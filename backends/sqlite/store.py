"""SQLiteStore: the KV seam over one SQLite file, with the simulator's semantics.

Layout: ``kv(key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID`` (BLOBs compare with memcmp,
so keys sort exactly as in FoundationDB), ``quick_meta`` holding the last commit version
and ``quick_conflicts(version, ranges)`` holding each recent commit's write conflict ranges.

How a transaction runs (``docs/fdb-semantics.md`` sections 1-2):

* the first read opens a deferred read transaction (a WAL snapshot) and reads the version
  from ``quick_meta``; that is the read version, and every later read uses the snapshot;
* writes are buffered client-side by ``quickzones.backends.txnbuffer``;
* commit ends the snapshot, takes the write lock (``BEGIN IMMEDIATE``), fails with 1020 if
  a commit newer than the read version wrote into one of the read conflict ranges, else
  applies the writes (atomic ops against the current value), records its write ranges
  under the new version and bumps the version: a resolver serialised by SQLite's lock.

Versions are ``max(last + 1, clock in microseconds)``, so they advance ~1e6 per second and
conflict rows older than the 5 s lifetime (plus a second of slack) can be pruned.

Safe for several threads (each live transaction borrows its own pooled connection) and
several processes (WAL, ``busy_timeout``; a killed process's transaction never commits).
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from quickzones.backends._ranges import decode_ranges, encode_ranges, merge_ranges, ranges_intersect
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.sqlite.checkpointer import Checkpointer, PassResult
from quickzones.backends.sqlite.foreign_commits import ForeignCommits
from quickzones.backends.txnbuffer import (
    INTERNAL_ERROR,
    VERSIONS_PER_SECOND,
    BufferedTransaction,
    CommitRequest,
    KeyValue,
)
from quickzones.clock import Clock, SystemClock
from quickzones.errors import (
    InvalidStoreURL,
    NotAQuickStore,
    StorageError,
    StoreBusy,
    StoreFull,
    StoreNotFound,
)
from quickzones.store.kv import (
    COMMIT_UNKNOWN_RESULT,
    DATABASE_LOCKED,
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
)
from quickzones.urls import RETRY_OPTIONS, parse_retry_option

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY NOT NULL, value BLOB NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS quick_meta"
    " (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO quick_meta (id, version) VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS quick_conflicts"
    " (version INTEGER PRIMARY KEY, ranges BLOB NOT NULL)",
)
_VERSION = "SELECT version FROM quick_meta WHERE id = 0"
_GET = "SELECT value FROM kv WHERE key = ?"
# A batch of point reads in one statement (get_many); {} holds the placeholders.
_GET_MANY = "SELECT key, value FROM kv WHERE key IN ({})"
_KEYS_PER_SELECT = 500  # well under SQLite's limit on host parameters (999 before 3.32)
_RANGE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"
_RANGE_REVERSE = "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT ?"
_UPSERT = (
    "INSERT INTO kv (key, value) VALUES (?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_DELETE = "DELETE FROM kv WHERE key = ?"
_DELETE_RANGE = "DELETE FROM kv WHERE key >= ? AND key < ?"
_NEWER_CONFLICTS = "SELECT ranges FROM quick_conflicts WHERE version > ?"
_RECORD_CONFLICTS = "INSERT INTO quick_conflicts (version, ranges) VALUES (?, ?)"
_BUMP_VERSION = "UPDATE quick_meta SET version = ? WHERE id = 0"
_PRUNE_CONFLICTS = "DELETE FROM quick_conflicts WHERE version < ?"
_NEWEST_BEFORE = "SELECT max(version) FROM quick_conflicts WHERE version < ?"
# Conflict ranges covering every key a transaction can read (system keys are refused).
_EVERY_KEY = encode_ranges([(b"", b"\xff")])

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_PRUNE_EVERY = 64  # commits per process between prunes of old conflict rows
_POOL_SIZE = 16
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_FULL = 13
_SQLITE_NOTADB = 26
# The tables that make a file a quick store (checked before anything is written).
_QUICK_TABLES = frozenset({"kv", "quick_meta", "quick_conflicts"})


def _is_busy(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in str(err) or "busy" in str(err)


def _is_full(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code == _SQLITE_FULL or "disk is full" in str(err)


def _is_not_a_database(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code == _SQLITE_NOTADB or "not a database" in str(err)


def _translate(err: sqlite3.Error, during: str, store: str = "") -> StorageError:
    """SQLite errors as storage errors: brief lock contention is retryable (1038), a full
    disk is :class:`StoreFull` (SQLite rolls the transaction back: nothing was written),
    the rest is not retryable."""
    failure: StorageError
    if _is_full(err):
        failure = StoreFull(store or "sqlite", f"sqlite: {err} during {during}")
    elif _is_busy(err):
        failure = KVError(DATABASE_LOCKED, f"sqlite busy during {during}: {err}")
    else:
        failure = KVError(INTERNAL_ERROR, f"sqlite error during {during}: {err}")
    failure.__cause__ = err
    return failure


_BUSY_SLICE_S = 0.005
# The WAL is checkpointed and restarted once it holds this many bytes (see _bound_wal).
WAL_CHECKPOINT_BYTES = 16 * 1024 * 1024
# Each WAL frame is a page and this header.
_WAL_FRAME_HEADER = 24
# How long a truncating checkpoint waits for older snapshots to end (writers wait too).
# It usually succeeds within a few hundred ms; when readers starve it (SQLite's busy
# handler polls every 100 ms), a retry soon after does better than a longer wait.
_CHECKPOINT_WAIT_MS = 1000
# After a checkpoint that found readers in the way: retry once the WAL grew this much.
_CHECKPOINT_RETRY_BYTES = 2 * 1024 * 1024


class SQLiteStore:
    """A KV store in one SQLite file: ``SQLiteStore("quick.db", clock=...)``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        busy_timeout_ms: int = 10_000,
        synchronous: str = "NORMAL",
        url: str | None = None,
        retry_limit: int | None = None,
        timeout_ms: int | None = None,
        create: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self.url = url if url is not None else f"sqlite:///{self.path}"
        self.clock: Clock = clock if clock is not None else SystemClock()
        if synchronous.upper() not in _SYNCHRONOUS:
            raise StorageError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        self._synchronous = synchronous.upper()
        self.busy_timeout_ms = busy_timeout_ms
        self._busy_timeout_s = busy_timeout_ms / 1000.0
        # Bounds of quickzones.store.kv.run() on this store (None: its defaults).
        self.retry_limit = retry_limit
        self.timeout_ms = timeout_ms
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pool: list[sqlite3.Connection] = []
        # Connections inherited across fork() are never closed: closing one would drop
        # the parent's POSIX locks on the file.
        self._inherited: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._commits = 0
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_at = WAL_CHECKPOINT_BYTES
        self.checkpoints = 0  # bounding checkpoints this store ran (for tests, benches)
        self._page_bytes: int | None = None
        self.checkpointer = Checkpointer(self._connect, after_pass=self._bound_wal)
        self._closed = False
        # The application connection this thread's transactions write through, while an
        # enqueue runs in the application's own transaction (transaction_on).
        self._bound = threading.local()
        # A connection that never writes, for data_version() (see there).
        self._watch_lock = threading.Lock()
        self._watch_conn: sqlite3.Connection | None = None
        self._watch_pid = self._pid
        self._foreign = ForeignCommits()
        self._open_schema(create)

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None, *, create: bool = True) -> SQLiteStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute/path.db`` (as SQLAlchemy).

        Options: ``busy_timeout_ms`` (default 10000), ``synchronous`` (default NORMAL),
        run()'s bounds ``retry_limit`` and ``timeout_ms``. With ``create=False`` the file
        must already be a quick store (:class:`StoreNotFound`, :class:`NotAQuickStore`)
        and is never written to while opening.
        """
        try:
            parts = urlsplit(url)
        except ValueError as err:
            raise InvalidStoreURL(url, str(err)) from err
        if parts.scheme.lower() != "sqlite":
            raise InvalidStoreURL(url, "expected the sqlite:// scheme")
        if parts.netloc:
            raise InvalidStoreURL(url, "use sqlite:///relative.db or sqlite:////absolute.db")
        path = unquote(parts.path)
        path = path[1:] if path.startswith("/") else path
        if not path or path.endswith("/"):
            raise InvalidStoreURL(url, "missing database file name")
        options: dict[str, Any] = {}
        for option, raw in parse_qsl(parts.query, keep_blank_values=True):
            if option == "busy_timeout_ms":
                try:
                    options["busy_timeout_ms"] = int(raw)
                except ValueError as err:
                    raise InvalidStoreURL(
                        url, f"busy_timeout_ms={raw!r} is not an integer"
                    ) from err
            elif option == "synchronous":
                if raw.upper() not in _SYNCHRONOUS:
                    raise InvalidStoreURL(url, f"synchronous must be one of {_SYNCHRONOUS}")
                options["synchronous"] = raw
            elif option in RETRY_OPTIONS:
                options[option] = parse_retry_option(url, option, raw)
            else:
                raise InvalidStoreURL(url, f"unknown option {option!r}")
        parent = Path(path).parent
        if not parent.is_dir():
            hint = " (for an absolute path use four slashes: sqlite:////abs/path.db)"
            raise InvalidStoreURL(url, f"directory {str(parent)!r} does not exist{hint}")
        return cls(path, clock=clock, url=url, create=create, **options)

    # --- connections -------------------------------------------------------------------------

    def _connect(self, uri: str | None = None) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                uri or self.path,
                uri=uri is not None,
                # SQLite's own busy handler sleeps in steps of up to 100 ms, which makes
                # a latency tail whenever another process holds the write lock; it only
                # covers the first few ms, and _begin_immediate polls finely after that.
                timeout=_BUSY_SLICE_S,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # a connection follows its transaction
                cached_statements=256,
            )
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
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
            raise StorageError(f"cannot open sqlite database {self.path!r}: {err}") from err
        return conn

    def _acquire(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        if os.getpid() != self._pid:
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
            if not self._closed and len(self._pool) < _POOL_SIZE and os.getpid() == self._pid:
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

    # --- the KVStore protocol --------------------------------------------------------------

    def create_transaction(self) -> BufferedTransaction:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        bound: sqlite3.Connection | None = getattr(self._bound, "conn", None)
        if bound is not None:
            # Inside transaction_on in this thread: every transaction (part two of an
            # enqueue, a clock floor update) joins the application's SQLite transaction,
            # which holds the write lock a transaction of our own would wait for.
            from quickzones.backends.sqlite.app_transaction import AppTransaction

            return AppTransaction(self, bound)
        return SQLiteTransaction(self)

    @contextlib.contextmanager
    def transaction_on(self, connection: object) -> Iterator[BufferedTransaction]:
        """A transaction that writes through the application's own connection to this
        file, inside the application's own transaction: ``with store.transaction_on(conn)
        as tr: ...``; the application's COMMIT commits both, its ROLLBACK neither.

        ``connection``: a ``sqlite3.Connection``, a SQLAlchemy ``Connection`` or Django's
        ``connection`` (their DB-API connection is used). Details, conflicts and errors:
        :mod:`quickzones.backends.sqlite.app_transaction`.
        """
        from quickzones.backends.sqlite.app_transaction import AppTransaction, join

        conn, began = join(self, connection)
        previous = getattr(self._bound, "conn", None)
        self._bound.conn = conn
        try:
            tr = AppTransaction(self, conn)
            yield tr
            tr.commit()  # writes into the application's transaction; on_commit runs bound
        except BaseException:
            if began and conn.in_transaction:
                # The transaction this call opened holds nothing of the application's:
                # close it, so a caller that catches the error is not left holding the
                # write lock.
                conn.rollback()
            raise
        finally:
            self._bound.conn = previous

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        self.checkpointer.close()
        for conn in pool:
            conn.close()
        with self._watch_lock:
            watch, self._watch_conn = self._watch_conn, None
        if watch is not None and self._watch_pid == os.getpid():
            watch.close()

    # --- change detection (quickzones.store.kv.CommitCounter) -----------------------------------

    def data_version(self) -> int:
        """A number that changes after a commit to this file that this store object did
        not make: another process's, another store's, the application's own connection's
        (:mod:`~quickzones.backends.sqlite.foreign_commits`). SQLite's ``PRAGMA
        data_version`` on a connection of its own that never writes, and only when that
        changed a read of the newest commits' versions: some microseconds, so a waiter
        can poll it every millisecond."""
        with self._watch_lock:
            if self._closed:
                raise StorageError(f"store {self.url} is closed")
            if self._watch_conn is None or self._watch_pid != os.getpid():
                # After fork() the parent's connection is left alone (never closed here).
                self._watch_conn = self._connect()
                self._watch_pid = os.getpid()
                self._foreign = ForeignCommits()  # a forked child's commits are its own
            try:
                return self._foreign.poll(self._watch_conn)
            except sqlite3.Error as err:
                raise _translate(err, "data_version", self.url) from err

    # --- inspection helpers ----------------------------------------------------------------

    def snapshot_items(self) -> dict[bytes, bytes]:
        """The whole committed state in key order (one consistent snapshot)."""
        conn = self._acquire()
        try:
            return dict(conn.execute("SELECT key, value FROM kv ORDER BY key").fetchall())
        finally:
            self._release(conn)

    @property
    def committed_version(self) -> int:
        conn = self._acquire()
        try:
            version: int = conn.execute(_VERSION).fetchone()[0]
            return version
        finally:
            self._release(conn)

    def _random(self) -> float:
        with self._lock:
            return self._rng.random()

    # --- commit ----------------------------------------------------------------------------

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting up to ``busy_timeout_ms`` in short polls."""
        deadline = time.monotonic() + self._busy_timeout_s
        pause = 0.0005
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as err:
                if not _is_busy(err):
                    raise _translate(err, "BEGIN IMMEDIATE", self.url) from err
                if time.monotonic() >= deadline:
                    # Another connection held the lock all along: retrying at once would
                    # only wait again, so the caller hears of it (not run()'s loop).
                    raise StoreBusy(self.url, self.busy_timeout_ms) from err
            except sqlite3.Error as err:
                raise _translate(err, "BEGIN IMMEDIATE", self.url) from err
            time.sleep(pause)
            pause = min(pause * 2, 0.004)

    def _commit_on(self, conn: sqlite3.Connection, request: CommitRequest) -> int:
        self._begin_immediate(conn)
        try:
            commit_version = self._apply(conn, request)
            self._foreign.made(commit_version)
            self._commits += 1
            if self._commits % _PRUNE_EVERY == 0:
                _prune_conflicts(conn, self.clock.now())
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise _translate(err, "commit", self.url) from err
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # COMMIT failed and left the transaction open
                raise _translate(err, "COMMIT", self.url) from err
            if _is_full(err):
                # Out of space while appending to the WAL: SQLite rolled back and the
                # frames were never marked committed, so nothing of it is visible.
                raise _translate(err, "COMMIT", self.url) from err
            raise KVError(COMMIT_UNKNOWN_RESULT, f"sqlite COMMIT failed: {err}") from err
        return commit_version

    def _apply(self, conn: sqlite3.Connection, request: CommitRequest) -> int:
        """The resolver's half of a commit, on ``conn`` holding the write lock: the
        conflict check, the writes, their conflict ranges and the new version; the caller
        commits (or, for an application's connection, the application does)."""
        version: int = conn.execute(_VERSION).fetchone()[0]
        now = self.clock.now()
        if request.too_old(now):
            raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
        rv = request.read_version
        if rv is not None and request.read_conflicts and version > rv:
            for (raw,) in conn.execute(_NEWER_CONFLICTS, (rv,)):
                if ranges_intersect(request.read_conflicts, decode_ranges(raw)):
                    raise KVError(NOT_COMMITTED, "a read conflicts with a later commit")
        commit_version = max(version + 1, int(now * VERSIONS_PER_SECOND))
        writes = request.resolve(
            make_versionstamp(commit_version, 0), lambda key: _current(conn, key)
        )
        if writes.clears:
            conn.executemany(_DELETE_RANGE, writes.clears)
        if writes.sets:
            conn.executemany(_UPSERT, writes.sets)
        if writes.deletes:
            conn.executemany(_DELETE, [(key,) for key in writes.deletes])
        conflict_ranges = request.write_conflicts
        if writes.extra_write_conflicts:
            conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
        conn.execute(_RECORD_CONFLICTS, (commit_version, encode_ranges(conflict_ranges)))
        conn.execute(_BUMP_VERSION, (commit_version,))
        return commit_version

    # --- keeping the WAL bounded ----------------------------------------------------------

    def _bound_wal(self, conn: sqlite3.Connection, passed: PassResult) -> None:
        """After a background pass (``passed``): checkpoint and restart the WAL once it
        holds ``WAL_CHECKPOINT_BYTES`` of frames.

        SQLite's automatic checkpoint is passive: it copies pages back into the database
        but restarts the WAL only at a moment when no reader holds a snapshot in it. With
        overlapping read transactions that moment never comes and the WAL grows without
        bound. A RESTART checkpoint takes the write lock, waits (up to
        ``_CHECKPOINT_WAIT_MS``) for the snapshots older than the newest commit to end
        (new readers read the database file meanwhile), copies the few frames the pass
        left, and the next commit writes from the WAL's start, reusing the file. Our
        snapshots are short (the 5 s lifetime bounds them), so the wait is too; if it
        fails anyway, the next pass after the WAL grew by ``_CHECKPOINT_RETRY_BYTES``
        tries again. Not TRUNCATE: shrinking the file to nothing held the write lock
        through its truncation and a disk flush, 10-17 ms against ~2 ms here, and every
        writer in every process waited (``journal_size_limit`` trims a file that grew
        past twice the bound, at the first commit after a restart).
        """
        wal_bytes = passed.log * (self._page_size(conn) + _WAL_FRAME_HEADER)
        if wal_bytes < self._checkpoint_at or not self._checkpoint_lock.acquire(blocking=False):
            return
        try:
            conn.execute(f"PRAGMA busy_timeout = {_CHECKPOINT_WAIT_MS}")
            try:
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_SLICE_S * 1000)}")
            if busy:
                self._checkpoint_at = wal_bytes + _CHECKPOINT_RETRY_BYTES
            else:
                self._checkpoint_at = WAL_CHECKPOINT_BYTES
                self.checkpoints += 1
        except sqlite3.Error:
            # Best effort (e.g. a full disk): the commit already succeeded; try again later.
            self._checkpoint_at = wal_bytes + _CHECKPOINT_RETRY_BYTES
        finally:
            self._checkpoint_lock.release()

    def _page_size(self, conn: sqlite3.Connection) -> int:
        if self._page_bytes is None:
            self._page_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return self._page_bytes


def _journal_mode(conn: sqlite3.Connection) -> str:
    """The file's journal mode; reading it changes nothing."""
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


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


def _current(conn: sqlite3.Connection, key: bytes) -> bytes | None:
    row = conn.execute(_GET, (key,)).fetchone()
    return None if row is None else bytes(row[0])


class SQLiteTransaction(BufferedTransaction):
    """A transaction on a :class:`SQLiteStore`; holds a WAL snapshot while it reads."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._conn: sqlite3.Connection | None = None
        super().__init__(store.clock)

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

    def _snapshot(self) -> sqlite3.Connection:
        assert self._conn is not None, "read before the read version was acquired"
        self._check_too_old(self._clock.now())
        return self._conn

    def _read_key(self, key: bytes) -> bytes | None:
        conn = self._snapshot()
        try:
            row = conn.execute(_GET, (key,)).fetchone()
        except sqlite3.Error as err:
            raise _translate(err, "get") from err
        return None if row is None else bytes(row[0])

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        conn = self._snapshot()
        found: dict[bytes, bytes] = {}
        try:
            for at in range(0, len(keys), _KEYS_PER_SELECT):
                chunk = keys[at : at + _KEYS_PER_SELECT]
                sql = _GET_MANY.format(", ".join("?" * len(chunk)))
                found.update((bytes(k), bytes(v)) for k, v in conn.execute(sql, chunk))
        except sqlite3.Error as err:
            raise _translate(err, "get_many") from err
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        conn = self._snapshot()
        sql = _RANGE_REVERSE if reverse else _RANGE
        try:
            rows = conn.execute(sql, (begin, end, limit or -1)).fetchall()
        except sqlite3.Error as err:
            raise _translate(err, "get_range") from err
        return [(bytes(k), bytes(v)) for k, v in rows]

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        store = self._store
        conn, self._conn = self._conn, None
        if conn is None:
            conn = store._acquire()
        try:
            if conn.in_transaction:
                conn.execute("COMMIT")  # end the snapshot: the write lock needs the newest state
            # Threads of one process queue on a Python lock rather than in SQLite's busy
            # handler, whose sleeps (up to 100 ms each) would make a long latency tail.
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

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._store._release(conn)

    def _random(self) -> float:
        return self._store._random()

    def __del__(self) -> None:
        # An abandoned transaction must not pin its WAL snapshot (and connection) forever.
        with contextlib.suppress(Exception):
            self._release()

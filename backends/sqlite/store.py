"""SQLiteStore: the KV seam over one SQLite file, with the simulator's semantics.

Layout: ``kv(key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID`` (BLOBs compare with memcmp,
so keys sort exactly as in FoundationDB), ``quick_meta`` holding the last commit version
and ``quick_conflicts(version, ranges)`` holding each recent commit's write conflict ranges.

How a transaction runs (``shared/fdb-semantics.md`` sections 1-2):

* the first read opens a deferred read transaction (a WAL snapshot) and reads the version
  from ``quick_meta``; that is the read version, and every later read uses the snapshot;
* writes are buffered client-side by ``backends._txnbuffer``;
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
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from backends._ranges import decode_ranges, encode_ranges, merge_ranges, ranges_intersect
from backends._txnbuffer import (
    INTERNAL_ERROR,
    VERSIONS_PER_SECOND,
    BufferedTransaction,
    CommitRequest,
    KeyValue,
)
from backends._versionstamps import make_versionstamp
from quick_core.clock import Clock, SystemClock
from quick_core.errors import InvalidStoreURL, StorageError
from quick_core.kv import (
    COMMIT_UNKNOWN_RESULT,
    DATABASE_LOCKED,
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
)

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

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_PRUNE_EVERY = 64  # commits per process between prunes of old conflict rows
_POOL_SIZE = 16
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6


def _translate(err: sqlite3.Error, during: str) -> KVError:
    """SQLite errors as KV errors: lock contention is retryable, the rest is not."""
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in str(err):
        failure = KVError(DATABASE_LOCKED, f"sqlite busy during {during}: {err}")
    else:
        failure = KVError(INTERNAL_ERROR, f"sqlite error during {during}: {err}")
    failure.__cause__ = err
    return failure


_BUSY_SLICE_S = 0.005


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
    ) -> None:
        self.path = os.fspath(path)
        self.url = url if url is not None else f"sqlite:///{self.path}"
        self.clock: Clock = clock if clock is not None else SystemClock()
        if synchronous.upper() not in _SYNCHRONOUS:
            raise StorageError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._busy_timeout_s = busy_timeout_ms / 1000.0
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pool: list[sqlite3.Connection] = []
        # Connections inherited across fork() are never closed: closing one would drop
        # the parent's POSIX locks on the file.
        self._inherited: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._commits = 0
        self._closed = False
        self._init_schema()

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> SQLiteStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute/path.db`` (as SQLAlchemy).

        Options: ``busy_timeout_ms`` (default 10000), ``synchronous`` (default NORMAL).
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
            else:
                raise InvalidStoreURL(url, f"unknown option {option!r}")
        parent = Path(path).parent
        if not parent.is_dir():
            hint = " (for an absolute path use four slashes: sqlite:////abs/path.db)"
            raise InvalidStoreURL(url, f"directory {str(parent)!r} does not exist{hint}")
        return cls(path, clock=clock, url=url, **options)

    # --- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                # SQLite's own busy handler sleeps in steps of up to 100 ms, which makes
                # a latency tail whenever another process holds the write lock; it only
                # covers the first few ms, and _begin_immediate polls finely after that.
                timeout=_BUSY_SLICE_S,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # a connection follows its transaction
                cached_statements=256,
            )
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        except sqlite3.Error as err:
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

    def _init_schema(self) -> None:
        # Several processes may open a new file at once: retry while another one holds
        # the lock, up to the busy timeout (connections themselves wait only briefly).
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            conn = self._connect()
            try:
                (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                if str(mode).lower() != "wal":
                    raise StorageError(f"cannot switch {self.path!r} to WAL (journal_mode={mode})")
                self._begin_immediate(conn)
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except sqlite3.OperationalError as err:
                conn.close()
                if ("locked" in str(err) or "busy" in str(err)) and time.monotonic() < deadline:
                    time.sleep(0.002)
                    continue
                raise StorageError(
                    f"cannot initialise sqlite database {self.path!r}: {err}"
                ) from err
            except (sqlite3.Error, KVError) as err:
                conn.close()
                raise StorageError(
                    f"cannot initialise sqlite database {self.path!r}: {err}"
                ) from err
            self._release(conn)
            return

    # --- the KVStore protocol --------------------------------------------------------------

    def create_transaction(self) -> SQLiteTransaction:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        return SQLiteTransaction(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()

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
                busy = "locked" in str(err) or "busy" in str(err)
                if not busy or time.monotonic() >= deadline:
                    raise _translate(err, "BEGIN IMMEDIATE") from err
            except sqlite3.Error as err:
                raise _translate(err, "BEGIN IMMEDIATE") from err
            time.sleep(pause)
            pause = min(pause * 2, 0.004)

    def _commit_on(self, conn: sqlite3.Connection, request: CommitRequest) -> int:
        self._begin_immediate(conn)
        try:
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
            self._commits += 1
            if self._commits % _PRUNE_EVERY == 0:
                # Rows older than the lifetime (+1 s slack) precede every live read version.
                horizon = int((now - TRANSACTION_LIFETIME_S - 1.0) * VERSIONS_PER_SECOND)
                conn.execute(_PRUNE_CONFLICTS, (horizon,))
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(err, sqlite3.Error):
                raise _translate(err, "commit") from err
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")  # COMMIT failed and left the transaction open
                raise _translate(err, "COMMIT") from err
            raise KVError(COMMIT_UNKNOWN_RESULT, f"sqlite COMMIT failed: {err}") from err
        return commit_version


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
            with store._write_lock:
                return store._commit_on(conn, request), 0
        except sqlite3.Error as err:
            raise _translate(err, "commit") from err
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

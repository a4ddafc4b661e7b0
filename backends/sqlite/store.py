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

One module each: the schema and statements (``sql``), SQLite's errors (``errors``), the
connection pool and schema check (``connections``), the commit resolver (``resolver``),
the WAL bound (``wal``), the transaction (``transaction``); this module opens the store
and wires them (``state`` holds what they share).
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from quickzones.backends._foreign_commits import ForeignCommits
from quickzones.backends.sqlite.checkpointer import Checkpointer
from quickzones.backends.sqlite.errors import _translate
from quickzones.backends.sqlite.file_identity import FileIdentity
from quickzones.backends.sqlite.file_signal import FileSignal, open_signal
from quickzones.backends.sqlite.known_values import KnownValues
from quickzones.backends.sqlite.native import NativeTransactions
from quickzones.backends.sqlite.resolver import CommitResolver
from quickzones.backends.sqlite.sql import _VERSION, _VERSIONS_AFTER
from quickzones.backends.sqlite.transaction import SQLiteTransaction
from quickzones.backends.sqlite.wal import WAL_CHECKPOINT_BYTES, WalBound
from quickzones.backends.txnbuffer import BufferedTransaction
from quickzones.clock import Clock, SystemClock
from quickzones.errors import InvalidStoreURL, StorageError
from quickzones.urls import RETRY_OPTIONS, parse_retry_option

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
ZONE_LAYOUTS = ("kv", "sql")


class _Bound(threading.local):
    """The application connection this thread's transactions write through (None: none).
    A class attribute, so reading it finds the default without the AttributeError
    ``getattr(local, name, None)`` raises and clears on a thread that never set it."""

    conn: sqlite3.Connection | None = None


class SQLiteStore(NativeTransactions, CommitResolver, WalBound):
    """A KV store in one SQLite file: ``SQLiteStore("quick.db", clock=...)``."""

    # No server, one writer at a time (kv.commits_in_process).
    commits_in_process = True

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
        zones: str = "kv",
    ) -> None:
        self.path = os.fspath(path)
        if zones not in ZONE_LAYOUTS:
            raise StorageError(f"zones must be one of {ZONE_LAYOUTS}, not {zones!r}")
        # Where items and pointers live: "kv", as every other key (the default), or
        # "sql", tables of their own beside it (quickzones.store.sql; issue 44).
        self.zones = zones
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
        self._bound = _Bound()
        # A connection that never writes, for data_version() (see there).
        self._watch_lock = threading.Lock()
        self._watch_conn: sqlite3.Connection | None = None
        self._watch_pid = self._pid
        self._foreign = ForeignCommits()
        # What this store's last commits left in the keys read after them (resolver).
        self._known = KnownValues()
        self._watch_data_version: int | None = None  # PRAGMA data_version when last read
        # Writes to the file or its WAL, from the kernel (file_signal): the watcher of
        # data_version() sleeps on it. Opened with the watching connection, not before
        # (an inotify descriptor each: producers never watch).
        self._signal: FileSignal | None = None
        # Deleted or replaced under this process: noticed within a second (StoreLost).
        self._file = FileIdentity(self.path, self.url)
        self._open_schema(create)
        self._file.opened()

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None, *, create: bool = True) -> SQLiteStore:
        """``sqlite:///relative.db`` or ``sqlite:////absolute/path.db`` (as SQLAlchemy).

        Options: ``busy_timeout_ms`` (default 10000), ``synchronous`` (default NORMAL),
        run()'s bounds ``retry_limit`` and ``timeout_ms``, ``zones`` (``kv``, the default,
        or ``sql``: items and pointers in tables of their own, :mod:`quickzones.store.sql`).
        With ``create=False`` the file must already be a quick store
        (:class:`StoreNotFound`, :class:`NotAQuickStore`) and is never written to while
        opening.
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
            elif option == "zones":
                if raw not in ZONE_LAYOUTS:
                    raise InvalidStoreURL(url, f"zones must be one of {ZONE_LAYOUTS}")
                options["zones"] = raw
            elif option in RETRY_OPTIONS:
                options[option] = parse_retry_option(url, option, raw)
            else:
                raise InvalidStoreURL(url, f"unknown option {option!r}")
        parent = Path(path).parent
        if not parent.is_dir():
            hint = " (for an absolute path use four slashes: sqlite:////abs/path.db)"
            raise InvalidStoreURL(url, f"directory {str(parent)!r} does not exist{hint}")
        return cls(path, clock=clock, url=url, create=create, **options)

    # --- the KVStore protocol --------------------------------------------------------------

    def create_transaction(self) -> BufferedTransaction:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        bound = self._bound.conn
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
        previous = self._bound.conn
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
            signal, self._signal = self._signal, None
        if watch is not None and self._watch_pid == os.getpid():
            watch.close()
        if signal is not None:
            signal.close()

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
                if self._signal is not None:  # the parent's, across fork(): our copy
                    self._signal.close()
                # Before the first read: a commit after that read is signalled.
                self._signal = open_signal(self.path)
                self._watch_pid = os.getpid()
                self._foreign = ForeignCommits()  # a forked child's commits are its own
                self._watch_data_version = None
            try:
                return self._foreign_count(self._watch_conn)
            except sqlite3.Error as err:
                raise _translate(err, "data_version", self.url) from err

    @property
    def commits_signalled(self) -> bool:
        """Whether :meth:`wait_for_commits` returns on a commit (a kernel file signal
        is open), not only after its timeout: then a watcher may read
        :meth:`data_version` at a slow tick. Known once it was read."""
        return self._signal is not None

    def wait_for_commits(self, timeout_s: float) -> None:
        """Return when the file or its WAL was written (a commit, anyone's, this store's
        too) since the last call, or after ``timeout_s`` (the commit watcher's wait
        between reads of :meth:`data_version`); without a signal, after ``timeout_s``."""
        signal = self._signal
        if signal is None or self._watch_pid != os.getpid():
            time.sleep(timeout_s)
            return
        signal.wait(timeout_s)

    def _foreign_count(self, conn: sqlite3.Connection) -> int:
        # The pragma changes on any other connection's commit, read from shared memory:
        # the commits' versions are read only when it did.
        data_version: int = conn.execute("PRAGMA data_version").fetchone()[0]
        if data_version == self._watch_data_version:
            return self._foreign.count
        first = self._watch_data_version is None
        self._watch_data_version = data_version
        if first or self._foreign.seen is None:
            return self._foreign.start(conn.execute(_VERSION).fetchone()[0])
        after = conn.execute(_VERSIONS_AFTER, (self._foreign.seen,))
        return self._foreign.saw([v for (v,) in after])

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


__all__ = ["SQLiteStore", "SQLiteTransaction"]

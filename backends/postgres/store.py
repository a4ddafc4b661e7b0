"""PostgresStore: the KV seam over tables in one PostgreSQL schema, with the simulator's
semantics (``docs/fdb-semantics.md`` sections 1-2), as SQLite's store has them:

* the first read opens a REPEATABLE READ READ ONLY transaction on a pooled connection and
  reads its snapshot (``pg_current_snapshot()``) and the last commit version (the read
  version); every later read uses the same snapshot;
* writes are buffered client-side by ``quickzones.backends.txnbuffer``;
* commit ends the snapshot and, in a transaction of its own, takes the advisory locks of
  the keys it read and wrote (``locks``: only commits touching the same keys wait for each
  other), fails with 1020 if a commit the snapshot did not see wrote into one of the read
  conflict ranges (``quick_log`` names each commit's transaction), else records its write
  ranges, applies the writes (atomic adds by the server) and commits.

Log rows are pruned once a snapshot taken more than 6 s ago saw their commit. Versions
come from a sequence under the commit's locks, so commits that touch the same keys get
them (and the versionstamps made from them) in commit order.

The tables live in the schema the URL names (``?schema=``, default ``quick``); opening
creates it (or migrates an older layout), and refuses, untouched, a schema holding tables
that are not quick's (:class:`NotAQuickStore`).

One module each: the statements (``sql``), how they are sent (``wire``: one write a round
trip, parameters in binary), PostgreSQL's errors (``errors``), the commit resolver
(``resolver``), the transaction (``transaction``), the application's own
transaction (``app_transaction``, its connection and version held in ``joined``); this
module opens the store, its schema and its pool.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import generators

from quickzones.backends._foreign_commits import ForeignCommits
from quickzones.backends.postgres import wire
from quickzones.backends.postgres.after_commit import AfterCommit
from quickzones.backends.postgres.errors import (
    UNREACHABLE_PACE_CAP_S,
    UNREACHABLE_PACE_S,
    ServerUnreachable,
    connect_failure,
    translate,
)
from quickzones.backends.postgres.joined import Joined
from quickzones.backends.postgres.known_reads import KnownReads
from quickzones.backends.postgres.locks import lock_space, plan
from quickzones.backends.postgres.native import NativeTransactions
from quickzones.backends.postgres.notifications import CommitNotifications
from quickzones.backends.postgres.resolver import PRUNE_EVERY, Connection
from quickzones.backends.postgres.sql import (
    FORMAT,
    FORMAT_VERSION,
    QUICK_TABLES,
    SCHEMA_ACCESS,
    TABLES_IN_SCHEMA,
    Statements,
    check_schema_name,
)
from quickzones.backends.postgres.transaction import SESSION_SETTLE_S, PostgresTransaction
from quickzones.backends.txnbuffer import BufferedTransaction
from quickzones.clock import Clock, SystemClock
from quickzones.errors import (
    HeldByOwnTransaction,
    InvalidStoreURL,
    NotAQuickStore,
    StorageError,
    StoreMisconfigured,
    StoreNotFound,
    StoreUnavailable,
)
from quickzones.store.kv import TRANSACTION_LIFETIME_S, key_after
from quickzones.urls import RETRY_OPTIONS, parse_retry_option

_POOL_SIZE = 16
# The shortest tick a commit watcher reads data_version at: each read is a round trip to
# the server (SQLite's is a read of shared memory, every millisecond).
DATA_VERSION_TICK_S = 0.005
DEFAULT_SCHEMA = "quick"
_SCHEMES = ("postgresql", "postgres")
# The ``listen`` URL option: LISTEN for commit notifications when they are heard (auto),
# or never (off: behind PgBouncer in transaction pooling mode LISTEN cannot work).
_LISTEN = {"auto": True, "off": False}
# The ``prepare`` URL option: prepare each statement once per connection until a pooler
# shows it does not keep them (auto), or never (off) (wire.py).
_PREPARE = {"auto": True, "off": False}
# The ``server_pointer_check`` URL option: an enqueue's pointer check made by the server at
# its commit where the schema has quick_ensure3 (auto), or read by the client first (off).
_SERVER_POINTER_CHECK = {"auto": True, "off": False}
# libpq's wait for a server's answer when connecting, unless the caller has less time.
CONNECT_TIMEOUT_S = 10
# Taken while a schema is created or migrated, so processes opening one store at once
# wait for each other (an advisory lock: it touches no table).
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('quickzones schema ' || %s))"


def _answered(conn: Connection) -> bool:
    """Read the answer of a ROLLBACK :meth:`PostgresStore._release` sent without waiting;
    False (the connection closed) when it failed."""
    if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
        return True
    try:
        results = conn.wait(generators.fetch_many(conn.pgconn))
    except psycopg.Error:
        results = []
    if results and all(r.status == psycopg.pq.ExecStatus.COMMAND_OK for r in results):
        return True
    conn.close()
    return False


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _server_of(conninfo: str) -> str:
    """``host:port`` of the server a conninfo names, as errors show it."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "?"
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    return f"{host}:{params.get('port') or 5432}"


# A server session in a transaction (pg_stat_activity: the store's role sees its own).
SESSION_IN_TRANSACTION = (
    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND (xact_start IS NOT NULL OR state = 'active')"
)


ZONE_LAYOUTS = ("kv", "sql")


class PostgresStore(NativeTransactions):
    """A KV store in one PostgreSQL schema: ``PostgresStore("postgresql://...", schema=...)``."""

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock | None = None,
        url: str | None = None,
        lock_timeout_ms: int = 10_000,
        retry_limit: int | None = None,
        timeout_ms: int | None = None,
        create: bool = True,
        listen: bool = True,
        prepare: bool = True,
        server_pointer_check: bool = True,
        zones: str = "kv",
    ) -> None:
        if zones not in ZONE_LAYOUTS:
            raise InvalidStoreURL(url or conninfo, f"zones must be one of {ZONE_LAYOUTS}")
        # Where items and pointers live: "kv", as every other key (the default), or
        # "sql", tables of their own beside it (quickzones.store.sql; issue 42).
        self.zones = zones
        wrong = check_schema_name(schema)
        if wrong is not None:
            raise InvalidStoreURL(url or conninfo, f"schema {schema!r} {wrong}")
        self.conninfo = conninfo
        self.schema = schema
        self.url = url if url is not None else f"{conninfo}?schema={schema}"
        # The URL as errors and logs show it: without its password.
        self.shown = _without_password(self.url)
        self.server = _server_of(conninfo)
        # When connections started failing with no server answering (the clock's time),
        # None while they succeed: a call gives up once this is older than its timeout
        # (PostgresTransaction), so one call's several transactions do not each wait it.
        self._unreachable_since: float | None = None
        # While it lasts, when a transaction may try to connect next (the clock's time):
        # a transaction that gave up returns at once, so without this pacing loops that
        # call again at once (a consumer's) would try to connect thousands of times a
        # second; paced, one call in an outage waits at most UNREACHABLE_PACE_CAP_S.
        self._next_try_at = 0.0
        self._failed_tries = 0
        self._failed_at = 0.0  # when the last try that failed ended
        self.unreachable_detail = ""  # what the last failed connection said
        # This object's commits' NOTIFY payload: its own listener passes over them.
        self.sender = os.urandom(8).hex()
        self.sql = Statements(schema, self.sender, lock_timeout_ms)
        self.preparing = wire.Preparing(prepare, self.shown)
        self.lock_space = lock_space(schema)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.lock_timeout_ms = lock_timeout_ms
        self.retry_limit = retry_limit
        self.timeout_ms = timeout_ms
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._pool: list[Connection] = []
        # Connections inherited across fork() are never closed here: closing one would
        # end the parent's session on the socket they share.
        self._inherited: list[Connection] = []
        self._pid = os.getpid()
        self._commits = 0
        # Snapshots of this store's transactions with their read times, about one a
        # second, oldest first: the prune's (prune_due).
        self._snapshots: deque[tuple[float, str]] = deque()
        self._closed = False
        self._bound = threading.local()
        self._identity: tuple[Any, ...] | None = None
        # Application connections already seen to reach this database (a session never
        # moves to another one): join() asks each only once.
        self.same_database: weakref.WeakSet[object] = weakref.WeakSet()
        self.foreign = ForeignCommits()
        # What this store read after its commits, for the next enqueue's part one.
        self.known = KnownReads()
        # Whether enqueues' pointer checks are made by the server (kv.create_if_absent):
        # asked for, and the schema has quick_ensure3 (a store made before it gains it on
        # opening where the role may add it); else each enqueue reads its entry first.
        self._server_pointer_check = server_pointer_check
        self.guards = False
        # Whether those commits also make part two (kv.EarlierIfLater): guards, and the
        # schema has quick_pull3 (added on opening, as quick_ensure3 is).
        self.pulls = False
        self._watch_lock = threading.Lock()
        self.data_version_tick_s = DATA_VERSION_TICK_S
        self._notifications = CommitNotifications(self._connect, schema, self.sender, listen=listen)
        # The snapshot the commit counter last looked with (data_version).
        self._watched: str | None = None
        # What runs once an application's transaction has committed (part two of its
        # enqueues: app_transaction.py).
        self.after_commit = AfterCommit(
            self._acquire,
            self._release,
            self.clock,
            self.sql.wire["xact_status"],
            read_settled=self.read_settled,
        )
        self._open_schema(create)

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, *, create: bool = True
    ) -> PostgresStore:
        """``postgresql://user:password@host:port/database?schema=quick``.

        Options: ``schema`` (default ``quick``), ``lock_timeout_ms`` (how long a commit
        waits for another holding the locks of keys it touches, default 10000), run()'s
        bounds ``retry_limit`` and ``timeout_ms``, ``listen`` (``auto``, the default:
        LISTEN for commit notifications if they are heard; ``off``: never, poll, as behind
        PgBouncer in transaction pooling mode), ``prepare`` (``auto``, the default: prepare
        each statement once per connection, until a pooler shows that it does not keep
        them; ``off``: never), ``zones`` (``kv``, the default, or ``sql``: items and
        pointers in tables of their own, :mod:`quickzones.store.sql`); the rest go to libpq. With
        ``create=False`` the schema must already be a quick store and nothing is written
        while opening but the migration of an older layout.
        """
        try:
            parts = urlsplit(url)
        except ValueError as err:
            raise InvalidStoreURL(url, str(err)) from err
        if parts.scheme.lower() not in _SCHEMES:
            raise InvalidStoreURL(url, "expected the postgresql:// scheme")
        options: dict[str, Any] = {}
        libpq: list[tuple[str, str]] = []
        for option, raw in parse_qsl(parts.query, keep_blank_values=True):
            if option == "schema":
                options["schema"] = raw
            elif option == "lock_timeout_ms":
                try:
                    options["lock_timeout_ms"] = int(raw)
                except ValueError as err:
                    reason = f"lock_timeout_ms={raw!r} is not an integer"
                    raise InvalidStoreURL(url, reason) from err
            elif option in RETRY_OPTIONS:
                options[option] = parse_retry_option(url, option, raw)
            elif option == "listen":
                if raw not in _LISTEN:
                    raise InvalidStoreURL(url, f"listen={raw!r}: expected auto or off")
                options["listen"] = _LISTEN[raw]
            elif option == "prepare":
                if raw not in _PREPARE:
                    raise InvalidStoreURL(url, f"prepare={raw!r}: expected auto or off")
                options["prepare"] = _PREPARE[raw]
            elif option == "zones":
                if raw not in ZONE_LAYOUTS:
                    raise InvalidStoreURL(url, f"zones must be one of {ZONE_LAYOUTS}")
                options["zones"] = raw
            elif option == "server_pointer_check":
                if raw not in _SERVER_POINTER_CHECK:
                    reason = f"server_pointer_check={raw!r}: expected auto or off"
                    raise InvalidStoreURL(url, reason)
                options["server_pointer_check"] = _SERVER_POINTER_CHECK[raw]
            else:
                libpq.append((option, raw))
        conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(libpq), ""))
        return cls(conninfo, clock=clock, url=url, create=create, **options)

    # --- connections -----------------------------------------------------------------------

    def _connect(self, within_s: float | None = None) -> Connection:
        """A new connection; ``within_s``: the time its caller has left, which bounds
        libpq's wait for a server that never answers (CONNECT_TIMEOUT_S at most, libpq's
        shortest, 2 s, at least)."""
        timeout = CONNECT_TIMEOUT_S
        if within_s is not None:
            timeout = max(2, min(CONNECT_TIMEOUT_S, math.ceil(within_s)))
        tried_at = self.clock.now()
        try:
            conn: Connection = psycopg.connect(
                self.conninfo, autocommit=True, connect_timeout=timeout, prepare_threshold=None
            )
        except psycopg.Error as err:
            failure = connect_failure(err, self.shown, self.server)
            if isinstance(failure, ServerUnreachable):
                with self._lock:
                    now = self.clock.now()
                    if self._unreachable_since is None:
                        self._unreachable_since = tried_at
                    self._failed_tries += 1
                    self._failed_at = now
                    self.unreachable_detail = failure.detail
                    pace = UNREACHABLE_PACE_S * 2 ** min(self._failed_tries, 16)
                    self._next_try_at = now + min(pace, UNREACHABLE_PACE_CAP_S)
            raise failure from err
        if self._unreachable_since is not None:
            with self._lock:
                self._unreachable_since, self._failed_tries, self._next_try_at = None, 0, 0.0
        try:
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false)", (str(self.lock_timeout_ms),)
            )
        except psycopg.Error as err:
            conn.close()
            raise translate(err, "connect", self.shown) from err
        wire.enroll(conn, self.preparing)
        return conn

    def unreachable_for(self) -> float | None:
        """How long connections to the server have failed with no server answering
        (seconds), or None if the last one succeeded."""
        since = self._unreachable_since
        return None if since is None else max(0.0, self.clock.now() - since)

    def since_last_failure(self) -> float | None:
        """Seconds since the last failed try while no server answers; None when the last
        connection succeeded."""
        if self._unreachable_since is None:
            return None
        return max(0.0, self.clock.now() - self._failed_at)

    def next_try_in(self) -> float:
        """Seconds before a transaction should try to connect again while no server
        answers (0: now)."""
        if self._unreachable_since is None:
            return 0.0
        return max(0.0, self._next_try_at - self.clock.now())

    def settle_after_commits(self, timeout_s: float) -> None:
        """Wait (``timeout_s`` at most) for what follows the applications' COMMITs seen by
        now (part two of their enqueues: :meth:`AfterCommit.settle`), so that a consumer
        of this process run next finds their items."""
        self.after_commit.settle(timeout_s)

    def read_settled(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """``keys``' values once every commit in flight that writes one of them has ended.

        A commit into an application's transaction that read single keys only locks its
        single-key writes alone (``locks.py``): a commit whose check of a range ran before
        the application's COMMIT (a consumer's visit that did not see the new item) may
        end after it. What follows that COMMIT (part two of its enqueues) reads here, so
        it sees such a commit's writes (the pointer it moved), as FoundationDB's next
        read version would."""
        ids, _ = plan([(key, key_after(key)) for key in keys], [])
        settle = (self.sql.wire["settle"], (wire.int4(self.lock_space), wire.int4s(ids)), False)
        get = (self.sql.wire["get_many"], (wire.byteas(list(keys)),), True)
        conn = self._acquire()
        try:
            rows = wire.exchange(conn, (settle, get))[1].fetchall()
        except psycopg.Error as err:
            raise translate(err, "read after an application's commit", self.shown) from err
        finally:
            self._release(conn)
        found = {bytes(k): bytes(v) for k, v in rows}
        return [found.get(key) for key in keys]

    def wait_for_session(self, pid: int, within_s: float = SESSION_SETTLE_S) -> bool:
        """Wait, up to ``within_s``, until the server session ``pid`` is in no
        transaction; True once it is (or is gone), False if it still is or the server
        could not be asked.

        A connection lost while its COMMIT was unanswered (``commit_unknown_result``)
        leaves its server session running what it had received: its commit may still be
        under way, and a read made at once on another connection would see the state
        before it (the worker's check of a maybe-committed transactional attempt then ran
        the handler again: a doubled effect under lost answers, issue 42 point 5). Once
        that session's transaction has ended, its outcome is final and any read sees
        it. Behind a pooler the id is the pooler's, which matches no session: no wait."""
        deadline = time.monotonic() + within_s
        try:
            conn = self._acquire(within_s)
        except StorageError:
            return False
        try:
            while True:
                row = conn.execute(SESSION_IN_TRANSACTION, (pid,), prepare=False).fetchone()
                if row is None:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
        except psycopg.Error:
            return False
        finally:
            self._release(conn)

    def logged_commit(self, at: int, begins: list[bytes], ends: list[bytes]) -> int | None:
        """The commit version of the commit whose ``quick_log`` row holds this clock
        and these write ranges, or None when no such row is there (see
        ``PostgresTransaction._committed_after_all``)."""
        conn = self._acquire()
        try:
            args = (at, len(begins), begins, len(ends), ends)
            row = conn.execute(self.sql.logged_commit, args, prepare=False).fetchone()
        finally:
            self._release(conn)
        return None if row is None else int(row[0])

    def _acquire(self, within_s: float | None = None) -> Connection:
        if self._closed:
            raise StorageError(f"store {self.shown} is closed")
        if os.getpid() != self._pid:
            with self._lock:
                self._inherited.extend(self._pool)
                self._pool = []
                self._pid = os.getpid()
        while True:
            with self._lock:
                conn = self._pool.pop() if self._pool else None
            if conn is None:
                return self._connect(within_s)
            if not conn.closed and _answered(conn):
                return conn

    def _release(self, conn: Connection) -> None:
        if conn.closed or conn.broken:
            return
        status = conn.info.transaction_status
        try:
            if status == psycopg.pq.TransactionStatus.INTRANS:
                # A snapshot ends (a read-only transaction, a scan): the server ends it as
                # ROLLBACK arrives, and its answer is read by the connection's next user
                # (_answered), not waited for here: a round trip off every read.
                conn.pgconn.send_query(b"ROLLBACK")
                conn.wait(generators.send(conn.pgconn))
            elif status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            conn.close()
            return
        with self._lock:
            if not self._closed and len(self._pool) < _POOL_SIZE and os.getpid() == self._pid:
                self._pool.append(conn)
                return
        conn.close()

    def _random(self) -> float:
        with self._lock:
            return self._rng.random()

    def prune_due(self, seen: str | None, read_at: float, now: float) -> str | None:
        """Count a commit whose reads saw ``seen`` at ``read_at``; every PRUNE_EVERY-th,
        the newest snapshot kept that was taken more than 6 s ago (log rows of commits
        it saw can go: resolver.prune), else None."""
        with self._lock:
            self._commits += 1
            kept = self._snapshots
            if seen is not None and (not kept or read_at - kept[-1][0] >= 1.0):
                kept.append((read_at, seen))
            if self._commits % PRUNE_EVERY:
                return None
            horizon = now - TRANSACTION_LIFETIME_S - 1.0
            chosen: str | None = None
            while kept and kept[0][0] <= horizon:
                chosen = kept.popleft()[1]
            return chosen

    def server_identity(self, query: str) -> tuple[Any, ...] | None:
        """``query``'s row on one of this store's connections (asked once): how an
        application's connection is checked to reach the same database."""
        if self._identity is None:
            conn = self._acquire()
            try:
                self._identity = conn.execute(query).fetchone()
            except psycopg.Error as err:
                raise translate(err, "identity", self.shown) from err
            finally:
                self._release(conn)
        return self._identity

    # --- this thread's application transaction --------------------------------------------

    def held_here(self, conn: Connection, xid: str) -> None:
        """Note that this thread's application transaction ``xid`` on ``conn`` took the
        resolver's lock (:func:`~quickzones.backends.postgres.app_transaction.join`)."""
        self._bound.held = (weakref.ref(conn), xid)

    def joins_application_here(self) -> bool:
        """Whether a transaction made now on this thread joins an application's (inside
        :meth:`transaction_on`): :func:`quickzones.store.kv.joins_application_here`."""
        return getattr(self._bound, "joined", None) is not None

    def check_not_held_here(self) -> None:
        """Raise :class:`HeldByOwnTransaction` if this thread's application transaction
        still holds the resolver's lock: a commit of this thread's own would wait for
        it until ``lock_timeout`` and run()'s retries gave up (60 s). Free when this
        thread never joined one; one round trip on the application's connection while
        its transaction is open (it may be a later one, which holds nothing)."""
        held: tuple[weakref.ref[Connection], str] | None = getattr(self._bound, "held", None)
        if held is None:
            return
        conn, xid = held[0](), held[1]
        if conn is not None and not conn.closed and not conn.broken:
            status = conn.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INERROR:
                raise HeldByOwnTransaction(self.shown)  # its locks last until the ROLLBACK
            if status == psycopg.pq.TransactionStatus.INTRANS:
                try:
                    row = conn.execute(
                        "SELECT pg_current_xact_id_if_assigned()::text", prepare=False
                    )
                    current = row.fetchone()
                except psycopg.Error:
                    current = None
                if current is not None and current[0] == xid:
                    raise HeldByOwnTransaction(self.shown)
        self._bound.held = None

    # --- change detection (quickzones.store.kv.CommitCounter) -----------------------------

    def data_version(self) -> int:
        """A number that changes after a commit to this schema that this store object did
        not make: another process's, another store's, an application's own connection's
        (:mod:`~quickzones.backends._foreign_commits`). One query: the commits the last
        look's snapshot did not see and this one's does (quick_log's rows, by their
        transaction's id), a round trip, so a watcher reads it no more often than
        ``data_version_tick_s``."""
        with self._watch_lock:
            if os.getpid() != self._pid:
                self.foreign = ForeignCommits()  # a forked child's commits are its own
                self._watched = None
            conn = self._acquire()
            try:
                if self._watched is None:
                    row = conn.execute(self.sql.snapshot_now).fetchone()
                    assert row is not None
                    self._watched = str(row[0])
                    return self.foreign.start(0)
                # Every 5 ms in each idle consumer: through wire.py, psycopg's dump and
                # parse of it cost more than the server's work.
                seen = wire.text(self._watched)
                unseen = (self.sql.wire["commits_unseen"], (seen, seen), False)
                row = wire.exchange(conn, (unseen,))[0].fetchone()
                assert row is not None
                self._watched = row[0].decode()
                return self.foreign.saw(wire.ints(row[1]))
            except psycopg.Error as err:
                raise translate(err, "data_version", self.shown) from err
            finally:
                self._release(conn)

    def notify_commit(self) -> None:
        """Notify the schema's channel as a commit that made a pointer vest earlier does
        (for an application's, once it committed: app_transaction.py)."""
        conn = self._acquire()
        try:
            conn.execute("SELECT pg_notify(%s, %s)", self.sql.notify_args)
        except psycopg.Error as err:
            raise translate(err, "notify", self.shown) from err
        finally:
            self._release(conn)

    @property
    def listens(self) -> int:
        """The listening connections for commit notifications this store object made: one
        more after each reconnect (the last one terminated, the server restarted)."""
        return self._notifications.connects

    @property
    def commits_signalled(self) -> bool:
        """Whether :meth:`wait_for_commits` returns on a commit now (a listening
        connection that hears notifications is up), not only after its timeout: else
        the commit watcher polls (``listen=off``, behind PgBouncer, reconnecting)."""
        return self._notifications.signalled

    def wait_for_commits(self, timeout_s: float) -> None:
        """Return when a commit to this schema (anyone's, this store's too) was notified
        since the last call, or after ``timeout_s`` (the commit watcher's wait between
        reads of :meth:`data_version`)."""
        self._notifications.wait(timeout_s)

    # --- the schema --------------------------------------------------------------------------

    def _open_schema(self, create: bool) -> None:
        """Check the schema is quick's; with ``create``, make it so if it is absent or
        empty. A schema holding anything else is refused and left as it was."""
        try:
            # Opening waits for a server that never answers no longer than timeout_ms.
            conn = self._connect(self.timeout_ms / 1000 if self.timeout_ms else None)
        except ServerUnreachable as err:
            # Opening tries once: the caller (a process starting) decides whether to wait.
            raise StoreUnavailable(self.shown, err.server, err.detail) from err
        try:
            state = self._schema_state(conn)
            if state == "ready":
                self._check_functions(conn)
                return
            if state == "absent" and not create:
                raise StoreNotFound(self.shown)
            exists = state == "absent" and self._check_may_create(conn)
            with conn.transaction():
                conn.execute(_SCHEMA_LOCK, (self.schema,))
                state = self._schema_state(conn)  # another process may have done it
                if state == "absent":
                    if not exists:
                        conn.execute(self.sql.create_schema)
                    for statement in self.sql.create:
                        conn.execute(statement)
                elif state in ("layout 1", "layout 2"):
                    for statement in self.sql.migrate_to_3:
                        conn.execute(statement)
                    conn.execute(self.sql.retire_conflicts[int(state[-1])])
            self._check_functions(conn)
        except psycopg.errors.InsufficientPrivilege as err:
            raise StoreMisconfigured(
                self.shown, f"the URL's role may not open schema {self.schema!r}: {err}"
            ) from err
        except psycopg.Error as err:
            raise StorageError(f"cannot open postgresql store {self.shown}: {err}") from err
        finally:
            conn.close()

    def _check_functions(self, conn: Connection) -> None:
        """Set :attr:`guards` and :attr:`pulls` from the functions the schema has."""
        if not self._server_pointer_check:
            self.guards = self.pulls = False
            return
        sql = self.sql
        self.guards = self._has_function(conn, sql.ensure_function_exists, sql.ensure_function)
        self.pulls = self.guards and self._has_function(
            conn, sql.pull_function_exists, sql.pull_function
        )

    def _has_function(self, conn: Connection, exists: str, create: tuple[str, ...]) -> bool:
        """Whether the schema has a function of layout 3 that came after it
        (quick_ensure3, quick_pull3); added here to a layout 3 store made by a quick
        before it, where the role may create functions in the schema (a role that may not
        leaves it without: its enqueues read their pointer index entry first, or pull
        their pointer in a transaction of their own)."""
        row = conn.execute(exists).fetchone()
        if row is not None and row[0]:
            return True
        try:
            with conn.transaction():
                conn.execute(_SCHEMA_LOCK, (self.schema,))
                for statement in create:
                    conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True

    def _check_may_create(self, conn: Connection) -> bool:
        """Whether the (empty) schema exists already; refuse, naming the role, the schema
        and the database, a role that may not create the schema the URL names
        (PostgreSQL would blame the database alone)."""
        row = conn.execute(
            "SELECT has_database_privilege(current_database(), 'CREATE'), current_user,"
            " current_database(), EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)",
            (self.schema,),
        ).fetchone()
        assert row is not None
        may_create, role, database, exists = row
        if not may_create and not exists:
            raise StoreMisconfigured(
                self.shown,
                f'role "{role}" may not create schema "{self.schema}" in database'
                f' "{database}" (no CREATE privilege on the database): create the schema'
                " for it (CREATE SCHEMA ... AUTHORIZATION that role) or GRANT CREATE ON"
                " DATABASE to it",
            )
        return bool(exists)

    def _schema_state(self, conn: Connection) -> str:
        """``"ready"``, ``"absent"`` (no schema, or an empty one), ``"layout 1"`` or
        ``"layout 2"`` (an older layout, migrated to layout 3 on opening, even with
        ``create=False``: the stored items are kept); raises :class:`NotAQuickStore` for
        a schema quick does not recognise."""
        access = conn.execute(SCHEMA_ACCESS, (self.schema,)).fetchone()
        if access is None:
            return "absent"
        usable, role, database = access
        if not usable:
            # Its tables would look absent (information_schema hides them) and creating
            # them would blame the database.
            raise StoreMisconfigured(
                self.shown,
                f'role "{role}" has no USAGE privilege on schema "{self.schema}" in database'
                f' "{database}": GRANT USAGE ON SCHEMA (and SELECT, INSERT, UPDATE, DELETE'
                " on its tables) to it, or use a schema of its own",
            )
        tables = {str(name) for (name,) in conn.execute(TABLES_IN_SCHEMA, (self.schema,))}
        if not tables:
            return "absent"
        if not tables >= QUICK_TABLES:
            missing = ", ".join(sorted(QUICK_TABLES - tables))
            raise NotAQuickStore(self.shown, f"schema {self.schema!r} has no {missing} table")
        try:
            row = conn.execute(self.sql.meta).fetchone()
        except psycopg.errors.InsufficientPrivilege as err:
            raise StoreMisconfigured(
                self.shown,
                f"the URL's role may not read quick's tables in schema {self.schema!r}: {err}",
            ) from err
        except psycopg.Error as err:
            raise NotAQuickStore(self.shown, f"its quick_meta table is not quick's: {err}") from err
        if row is None or row[0] != FORMAT:
            raise NotAQuickStore(self.shown, "its quick_meta table names no quick layout")
        if int(row[1]) > FORMAT_VERSION:
            raise NotAQuickStore(
                self.shown,
                f"layout version {row[1]} is newer than this quick's ({FORMAT_VERSION}):"
                " upgrade quickzones",
            )
        if int(row[1]) < FORMAT_VERSION:
            return f"layout {min(int(row[1]), 2)}"
        return "ready"

    # --- the KVStore protocol --------------------------------------------------------------

    def create_transaction(self) -> BufferedTransaction:
        if self._closed:
            raise StorageError(f"store {self.shown} is closed")
        joined: Joined | None = getattr(self._bound, "joined", None)
        if joined is not None:
            from quickzones.backends.postgres.app_transaction import AppTransaction

            return AppTransaction(self, joined)
        return PostgresTransaction(self)

    @contextlib.contextmanager
    def transaction_on(self, connection: object) -> Iterator[BufferedTransaction]:
        """A transaction that writes through the application's own connection to this
        database, inside the application's own transaction: its COMMIT commits both, its
        ROLLBACK neither. ``connection``: a psycopg ``Connection``, a SQLAlchemy
        ``Connection``/``Session`` or Django's ``connection``
        (:mod:`quickzones.backends.postgres.app_transaction`)."""
        from quickzones.backends.postgres.app_transaction import AppTransaction, join

        joined = join(self, connection)
        previous = getattr(self._bound, "joined", None)
        self._bound.joined = joined
        try:
            tr = AppTransaction(self, joined)
            yield tr
            tr.commit()  # writes into the application's transaction
        finally:
            self._bound.joined = previous

    def close(self) -> None:
        self.after_commit.close()
        self._notifications.close()
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, []
        if os.getpid() != self._pid:
            return  # a forked child: these are the parent's sessions, left to it
        for conn in pool:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # --- inspection helpers ----------------------------------------------------------------

    def snapshot_items(self) -> dict[bytes, bytes]:
        """The whole committed state in key order (one consistent snapshot)."""
        conn = self._acquire()
        try:
            rows = conn.execute(self.sql.everything).fetchall()
            return {bytes(k): bytes(v) for k, v in rows}
        finally:
            self._release(conn)

    @property
    def committed_version(self) -> int:
        conn = self._acquire()
        try:
            row = conn.execute(self.sql.version).fetchone()
            assert row is not None
            return int(row[0])
        finally:
            self._release(conn)


__all__ = ["PostgresStore", "PostgresTransaction"]

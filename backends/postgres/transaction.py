"""A transaction on a PostgreSQL store: the storage half of a buffered transaction, read
from a REPEATABLE READ snapshot and committed through ``quick_commit3`` (the resolver)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import psycopg
from psycopg.pq import TransactionStatus

from quickzones.backends.postgres import resolver, wire
from quickzones.backends.postgres.errors import (
    UNREACHABLE_PACE_CAP_S,
    ServerUnreachable,
    translate,
)
from quickzones.backends.postgres.known_reads import MOST_KEYS, Seen
from quickzones.backends.postgres.sql import KEYS_PER_SELECT
from quickzones.backends.txnbuffer import CommitRequest, KeyValue
from quickzones.backends.txnbuffer.pooled import PooledTransaction
from quickzones.errors import StorageError, StoreUnavailable
from quickzones.store.kv import COMMIT_UNKNOWN_RESULT, NOT_COMMITTED, EarlierIfLater, KVError

if TYPE_CHECKING:
    from quickzones.backends.postgres.store import PostgresStore


# While no server answers, the longest a transaction already past its timeout waits for
# the store's next paced connection try (PostgresStore.next_try_in) before its own.
PAST_TIME_WAIT_S = 0.2
# The read version until the first read brings the real one with its answer.
_PENDING = -1
_BEGIN = wire.plain("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
# Sent in a relaxed commit's transaction (kv.relax_durability): its COMMIT returns without
# waiting for the WAL flush.
_RELAXED = "SET LOCAL synchronous_commit = off"
# How long after its COMMIT was sent an unanswered commit's log row is surely still kept
# (rows go once a snapshot taken over 6 s ago saw them: resolver.prune).
LOG_ROW_KEPT_S = 4.0
# How long a commit whose answer was lost waits for its server session's transaction to
# end, and asks again whether it committed, before it reports the unknown result
# (PostgresStore.wait_for_session, _committed_after_all).
SESSION_SETTLE_S = 3.0
# Between two tries of a commit's lookup whose asking failed (_committed_after_all).
LOOKUP_AGAIN_S = 0.02


class PostgresTransaction(PooledTransaction[resolver.Connection]):
    """A transaction on a :class:`PostgresStore`; holds a pooled connection (and its
    snapshot) from its first read until it commits or is reset."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        # A connection taken, its snapshot not opened yet: the first read opens it.
        self._opening = False
        # The snapshot the reads see (pg_snapshot's text), for the commit's check.
        self._seen: str | None = None
        # What the store kept that answered this try's first read (known_reads.py), and
        # that read's keys, which its commit reads again after COMMIT to keep them.
        self._known: Seen | None = None
        self._first_keys: Sequence[bytes] = ()
        # Set once a try that read kept values failed its check: the next tries read.
        self._read_afresh = False
        # kv.relax_durability asked in this try: COMMIT does not wait for the WAL flush.
        self._relaxed = False
        # kv.follows_own_commit in this try: what the commit it follows read after its
        # COMMIT, which kept values must match to answer its first read.
        self._follows: Mapping[bytes, bytes | None] | None = None
        # Whether the get_many under way reads without a conflict (snapshot=True).
        self._snapshot_read = False
        # kv.create_if_absent in this try: the server's conditional writes.
        self._guards: list[resolver.Guard] = []
        # kv.earlier_if_later in this try: the server's rewrites where still as expected.
        self._pulls: list[EarlierIfLater] = []
        # Set once a try with a guard failed: the next tries read and write themselves.
        self._unguarded = False
        # What the last commit's guards found after its COMMIT: each guard's key's value and
        # the value of the key it names, for create_if_absent's callers.
        self._guarded_values: dict[int, tuple[bytes | None, bytes | None]] = {}
        super().__init__(store)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._known = None
        self._first_keys = ()
        self._relaxed = False
        self._follows = None
        self._guards = []
        self._pulls = []

    def _committed_after_all(self, err: KVError, session: int, sent: float) -> int | None:
        """A COMMIT whose answer was lost: once its server session's transaction has
        ended, its ``quick_log`` row (the client's clock and its write ranges, unique to
        the keys it wrote) says whether it committed. Returns its commit version if it
        did; raises ``not_committed`` (retryable) if it did not; None where that cannot be
        known (the session still busy, no log row, the server unreachable, or too late:
        the row may be pruned), and the unknown result stands. Without this, a retried
        enqueue that had in fact committed stored its item again when a consumer had run
        and completed it meanwhile: its effect ran twice (issue 42 point 5)."""
        log_row = getattr(err, "log_row", None)
        store = self._store
        if log_row is None:
            return None
        # Asked again while SESSION_SETTLE_S lasts when the asking itself failed: a
        # network that cut the COMMIT's answer cuts a lookup too, and a lookup that gave
        # up left the unknown standing, so a fresh-id enqueue that had committed was
        # retried and stored its item again after a worker had run it: one effect twice
        # in 2 of 8 runs of integration/postgres/test_pg_exactly_once.py's lost answers.
        deadline = time.monotonic() + SESSION_SETTLE_S
        while True:
            if store.wait_for_session(session, max(0.0, deadline - time.monotonic())):
                if self._clock.now() - sent > LOG_ROW_KEPT_S:
                    return None
                try:
                    found = store.logged_commit(*log_row)
                    break
                except (psycopg.Error, StorageError):
                    pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(LOOKUP_AGAIN_S)
        if found is None:
            raise KVError(NOT_COMMITTED, "COMMIT unanswered, and it did not commit") from err
        return found

    def relax_durability(self) -> None:
        """kv.relax_durability: this try's COMMIT returns before its WAL is flushed."""
        self._relaxed = True

    def follows_own_commit(self, read: Mapping[bytes, bytes | None]) -> None:
        """kv.follows_own_commit: this try's first read may be answered from what the
        store kept, though it has not written yet, where that is ``read``."""
        self._follows = read

    def reset(self) -> None:
        super().reset()
        self._read_afresh = False
        self._unguarded = False

    def create_if_absent(
        self,
        key: bytes,
        writes: Callable[[], Sequence[tuple[bytes, bytes]]],
        expect: Mapping[bytes, bytes | None],
        follow: tuple[bytes, bytes],
        wake: bool = False,
    ) -> Callable[[], tuple[bytes | None, bytes | None] | None] | None:
        """kv.create_if_absent: the server writes ``writes`` at commit where ``key`` is
        absent then (``resolver.Guard``), with no read of this try's own: an enqueue into
        a zone this store has not just read is one round trip, and so are many, into as
        many zones, in one transaction. None where it cannot: a guard of ``key`` in this
        try already, a key of it written or read here (the buffer would
        not see the server's writes), a try after one whose guard failed (its expected
        values may have moved: the caller reads them), a store without the function, or
        one that allows no retry; or where what the store kept answers that read with no
        round trip (``known_reads.py``: a zone enqueued into a moment ago, whose commit's
        check of a few log rows costs the server less than this path's writes cost the
        client), which it does for a try's first read only."""
        self._check_open()
        store = self._store
        if (
            self._unguarded
            or not store.guards
            or store.retry_limit == 0
            or key in self._points
            or key in self._read_cache
            or any(guard.key == key for guard in self._guards)
            or (
                # Kept values answer a try's first read only: a later zone of the same
                # try would read in a round trip of its own.
                self._read_version is None
                and store.known.lookup([*expect, key], self._clock.now()) is not None
            )
        ):
            return None
        made = tuple(writes())
        if any(k in self._points for k, _ in made):
            return None
        guard = resolver.Guard(key, made, dict(expect), follow, wake)
        self._guards.append(guard)

        def values() -> tuple[bytes | None, bytes | None] | None:
            return self._guarded_values.get(id(guard))

        return values

    def earlier_if_later(
        self, make: Callable[[], EarlierIfLater | None], likely: bool = True
    ) -> bool:
        """kv.earlier_if_later: ``make()`` sent with the commit (``quick_pull3``, after the
        guards), where the schema has the function and nothing of it is in this try's
        buffer (which would not see the server's rewrite). An enqueue into a zone whose
        pointer vests later (a small tenant's, emptied by its last visit) is then one
        commit, not two: part two made by the server in part one's commit. Unless
        ``likely``, not where what this store kept of the record says it would not be
        rewritten."""
        self._check_open()
        if not self._store.pulls:
            return False
        spec = make()
        if spec is None:
            return False
        if any(k in self._points or k in self._read_cache for k in (spec.key, spec.new_entry)):
            return False
        if not likely:
            seen = self._store.known.lookup([spec.key], self._clock.now())
            if seen is not None and not spec.rewrites(seen.values[spec.key]):
                # As this store last read the record (just after one of its commits, a
                # moment ago) it would not be rewritten: a busy zone's pointer, leased or
                # vesting in time. Not sent (the call costs the server about as much as
                # the rest of a one-item enqueue's commit); the read after this commit
                # decides part two as before.
                return False
        for n, pull in enumerate(self._pulls):
            if pull.key == spec.key:  # another enqueue into the zone in this transaction
                if spec.limit < pull.limit:
                    self._pulls[n] = spec
                return True
        self._pulls.append(spec)
        return True

    def _acquire_read_version(self) -> int:
        # Every read version is followed by a read, which opens the snapshot and reads the
        # version in its own round trip (_read); get_read_version() alone opens it too.
        self._conn = self._connection()
        self._opening = True
        self._seen = None
        return _PENDING

    def _take_connection(self) -> resolver.Connection:
        conn, self._conn = self._conn, None
        return conn if conn is not None else self._connection()

    def _connection(self) -> resolver.Connection:
        """A pooled or new connection. While no server answers, a failed connection is
        retryable (run() backs off and tries again) until the transaction's timeout would
        pass before the next try: then :class:`StoreUnavailable`, which names the server
        and is not retried, so run() never ends in a timeout blaming an overloaded store.
        The outage counts from the store's first failed connection, so a call's later
        transactions (or a later call) in the same outage do not wait a timeout each:
        ``timeout_ms`` bounds the whole call (issue 41 point 7). Meanwhile tries are
        paced store-wide (:meth:`PostgresStore.next_try_in`, at most a second apart)."""
        store = self._store
        left = self._time_left()
        since_failure = store.since_last_failure()
        if since_failure is not None and left is not None and left <= 0:
            # Past its time (the outage outlasted it): it waits a little, so that a loop
            # calling again at once after a StoreUnavailable (a consumer's) goes a few
            # times a second, and tries only if no try failed in the last second (then
            # someone notices the server is back); else it gives up without a try of
            # its own, which against a server that never answers costs libpq's
            # shortest connect timeout, 2 s.
            due = UNREACHABLE_PACE_CAP_S - since_failure
            if due > 0:
                self._clock.sleep(min(due, PAST_TIME_WAIT_S))
                if due > PAST_TIME_WAIT_S:
                    raise StoreUnavailable(
                        store.shown,
                        store.server,
                        store.unreachable_detail,
                        store.unreachable_for() or 0.0,
                    )
        else:
            wait = store.next_try_in()
            if wait > 0:
                self._clock.sleep(wait if left is None else min(wait, left))
        try:
            return store._acquire(self._time_left())
        except ServerUnreachable as err:
            left = self._time_left()
            if left is not None and left <= min(self._backoff_s, self._max_retry_delay_s):
                raise self._given_up(err) from err
            raise

    def _time_left(self) -> float | None:
        """Seconds this transaction may still try, counted from the later of its start
        and the store's first failed connection in this outage; None without a timeout."""
        if not self._timeout_s:
            return None
        now = self._clock.now()
        spent = max(now - self._started, self._store.unreachable_for() or 0.0)
        return self._timeout_s - spent

    def _given_up(self, err: ServerUnreachable) -> StoreUnavailable:
        store = self._store
        return StoreUnavailable(
            store.shown, store.server, err.detail, store.unreachable_for() or 0.0
        )

    def get_read_version(self) -> int:
        self._ensure_read_version()
        if self._opening:
            self._read("read version", wire.plain("SELECT 1"))
        return super().get_read_version()

    def get_many(self, keys: Sequence[bytes], *, snapshot: bool = False) -> list[bytes | None]:
        self._snapshot_read = snapshot
        return super().get_many(keys, snapshot=snapshot)

    def _read_version_and_keys(self, keys: Sequence[bytes]) -> tuple[int, list[bytes | None]]:
        """The first read of a few keys (an enqueue's part one: the layout and the zone's
        index entry): answered, with no round trip, from what this store read of them in
        a snapshot after a commit of its own, when it kept all of them; the commit then
        checks them against that snapshot (``known_reads.py``).

        Only for a read with conflicts in a try that has written already, so will commit
        and be checked: a kept snapshot may be older than commits that ended before this
        try began, which a read-only try or a read without a conflict would miss,
        unchecked; or in a try that follows the commit whose round trip kept them
        (``kv.follows_own_commit``: part two's look at the pointer right after part one's
        commit, which reads what that round trip read after its COMMIT). Not for a store
        that allows no retry (``retry_limit=0``): ``kv.run`` counts every try, and a try
        that failed only because what was kept was stale would end the call."""
        if len(keys) <= MOST_KEYS:
            self._first_keys = keys
            wrote = bool(self._points or self._vs_keys or self._cleared is not None)
            follows = self._follows
            if (
                not self._read_afresh
                and not self._snapshot_read
                and self._store.retry_limit != 0
                and (wrote or follows is not None)
            ):
                seen = self._store.known.lookup(keys, self._read_time)
                if seen is not None and not wrote:
                    # Before any write, only the values just read after the commit this
                    # try follows: an older snapshot's (an earlier enqueue's) could tell
                    # that a pointer another process has moved since vests in time.
                    assert follows is not None
                    if any(k not in follows or follows[k] != seen.values[k] for k in keys):
                        seen = None
                if seen is not None:
                    # Its snapshot, version and time are this try's: the check and the
                    # 5 s lifetime count from the older read, as FoundationDB's would.
                    self._known = seen
                    self._seen = seen.snapshot
                    self._read_time = seen.at
                    values = seen.values
                    return seen.version, [values[key] for key in keys]
        return super()._read_version_and_keys(keys)

    def read_ahead(self, keys: Sequence[bytes], ranges: Sequence[tuple[bytes, bytes, int]]) -> None:
        """kv.read_ahead: ``keys`` and each range's first pairs in one round trip (with the
        snapshot's opening when it is the first read), kept for the reads that follow
        (:meth:`BufferedReads._keep_read_ahead`)."""
        self._check_open()
        keys = [k for k in dict.fromkeys(keys) if k not in self._read_cache]
        ranges = [r for r in ranges if r[0] < r[1] and self._cached_range(r[0], r[1]) is None]
        if not keys and not ranges:
            return
        self._ensure_read_version()
        wired = self._store.sql.wire
        statements: list[wire.Statement] = []
        for at in range(0, len(keys), KEYS_PER_SELECT):
            chunk = keys[at : at + KEYS_PER_SELECT]
            statements.append((wired["get_many"], (wire.byteas(chunk),), True))
        for begin, end, limit in ranges:
            params = (wire.bytea(begin), wire.bytea(end), wire.int8(limit))
            statements.append((wired["range"], params, True))
        answers = self._read_all("read ahead", statements)
        found: dict[bytes, bytes] = {}
        chunks = -(-len(keys) // KEYS_PER_SELECT)
        for rows in answers[:chunks]:
            found.update(rows.fetchall())
        pairs = [rows.fetchall() for rows in answers[chunks:]]
        self._keep_read_ahead(keys, [found.get(k) for k in keys], ranges, pairs)

    def _read(self, what: str, statement: wire.Statement) -> wire.Rows:
        return self._read_all(what, [statement])[0]

    def _read_all(self, what: str, statements: Sequence[wire.Statement]) -> list[wire.Rows]:
        """The rows of each of ``statements`` in the snapshot, in one round trip; the first
        read opens it as well, in the same round trip: BEGIN, the snapshot (taken by that
        first statement, so every later read sees exactly its data; the commit checks what
        it did not see) with the last commit version (the read version), then
        ``statements``.

        After a first read answered from kept values, a later read opens a newer snapshot
        than theirs; the commit still checks against the kept one, the older: whatever
        changed since it in what this try read fails the check."""
        if self._conn is None and self._known is not None:
            self._conn = self._connection()
            self._opening = True
        conn = self._snapshot()
        try:
            if not self._opening:
                return wire.exchange(conn, statements)
            read_version = wire.plain(self._store.sql.read_version)
            _, version, *rows = wire.exchange(conn, (_BEGIN, read_version, *statements))
        except psycopg.Error as err:
            raise translate(err, what, self._store.shown) from err
        row = version.fetchone()
        assert row is not None, "a snapshot has a row"
        self._opening = False
        if self._known is None:
            self._seen = row[0].decode()
            self._read_version = int(row[1])
            self._store.known.noted(self._read_version)
        return rows

    def _read_key(self, key: bytes) -> bytes | None:
        row = self._read("get", (self._store.sql.wire["get"], (wire.bytea(key),), True)).fetchone()
        return None if row is None else row[0]

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        found: dict[bytes, bytes] = {}
        text = self._store.sql.wire["get_many"]
        for at in range(0, len(keys), KEYS_PER_SELECT):
            chunk = keys[at : at + KEYS_PER_SELECT]
            found.update(self._read("get_many", (text, (wire.byteas(chunk),), True)).fetchall())
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        text = self._store.sql.wire["range_reverse" if reverse else "range"]
        params = (wire.bytea(begin), wire.bytea(end), wire.int8(limit or None))
        return self._read("get_range", (text, params, True)).fetchall()

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        store = self._store
        store.check_not_held_here()
        if self._opening:
            # Nothing was read from storage (a read version taken, no read sent): like
            # FoundationDB's read version taken at commit, no newer commit to check.
            request.read_version = None
            self._opening = False
        conn = self._take_connection()
        session = conn.info.backend_pid
        # End the snapshot (the resolver reads the newest state) and open the commit's
        # READ COMMITTED transaction in the round trip that takes the lock.
        reading = conn.info.transaction_status != TransactionStatus.IDLE
        begin: tuple[str, ...] = ("COMMIT", "BEGIN") if reading else ("BEGIN",)
        again: tuple[str, ...] = ("BEGIN",)
        if self._relaxed:
            begin, again = (*begin, _RELAXED), (*again, _RELAXED)
        now = self._clock.now()
        known = self._known
        keep = None
        if self._first_keys:
            keep = Seen("", 0, now, dict.fromkeys(self._first_keys))
        guards = self._guards
        self._guarded_values = {}
        if guards and keep is None:
            keep = Seen("", 0, now)
        try:
            try:
                version = resolver.apply(
                    conn,
                    store.sql,
                    request,
                    now,
                    snapshot=self._seen,
                    space=store.lock_space,
                    begin=begin,
                    end=("COMMIT",),
                    again=again,
                    keep=keep,
                    guards=guards,
                    pulls=self._pulls,
                )
                store.foreign.made(version)  # made known only by COMMIT's answer
                store.known.noted(version)
                if keep is not None and keep.snapshot:
                    store.known.learned(keep)
                    self._guarded_values = {id(g): _guarded(g, keep.values) for g in guards}
            except BaseException as err:
                if guards:
                    # Their expected values may have moved: the next try reads them.
                    self._unguarded = True
                    if isinstance(err, KVError) and err.code == NOT_COMMITTED:
                        self._retry_at_once = True
                if known is not None:
                    # What was kept may be stale: the next try reads afresh, at once if
                    # the check failed (that is no contention: nothing to back off from).
                    store.known.forget(known)
                    self._read_afresh = True
                    if isinstance(err, KVError) and err.code == NOT_COMMITTED:
                        self._retry_at_once = True
                if not conn.broken:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                if isinstance(err, psycopg.Error):
                    raise translate(err, "commit", store.shown) from err
                if isinstance(err, KVError) and err.code == COMMIT_UNKNOWN_RESULT:
                    # Its outcome final before anyone reads to learn it (wait_for_session),
                    # then learned here where its log row tells (_committed_after_all).
                    applied = self._committed_after_all(err, session, now)
                    if applied is not None:
                        store.foreign.made(applied)
                        store.known.noted(applied)
                        return applied, 0
                raise
            seen_before = store.prune_due(self._seen, request.read_time, now)
            if seen_before is not None:
                with contextlib.suppress(psycopg.Error):
                    resolver.prune(conn, store.sql, seen_before)
            return version, 0
        finally:
            store._release(conn)


def _guarded(
    guard: resolver.Guard, values: Mapping[bytes, bytes | None]
) -> tuple[bytes | None, bytes | None]:
    """What ``guard``'s commit read after its COMMIT: its key's value and the value of
    the key that value names (None: absent); its key not read: the value it wrote (that
    read skips a key holding it)."""
    found = values.get(guard.key)
    if found is None:
        return guard.mine, None
    return found, values.get(guard.follow[0] + found + guard.follow[1])

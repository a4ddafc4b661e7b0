"""The KV seam: an ordered, transactional key-value interface shaped like FoundationDB's.

All of QuiCK's storage logic is written once against :class:`KVTransaction`. Each backend
(``quickzones.backends.memory``, ``.sqlite``, ``.fdb``) implements it with the
semantics of ``docs/fdb-semantics.md``:

* a transaction reads at one read version and sees its own writes (including range reads
  over uncommitted sets and clears);
* non-snapshot reads add read conflict ranges; at commit the transaction fails with
  ``not_committed`` (1020) if a transaction that committed after its read version wrote a
  key in one of them; snapshot reads add none;
* writes are buffered and applied atomically at commit.

Storage functions take ``tr`` first and never commit; :func:`run` owns commit and retry.
"""

from __future__ import annotations

import functools
import inspect
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from quickzones.errors import KVError as KVError  # re-exported: the seam's error type
from quickzones.errors import (
    RetryLimitExceeded,
    StorageError,
    TransactionTooLarge,
    TransactionTooLong,
)

T = TypeVar("T")
P = ParamSpec("P")

# FoundationDB's limits (docs/fdb-semantics.md section 1).
KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
TRANSACTION_SIZE_LIMIT = 10_000_000
TRANSACTION_LIFETIME_S = 5.0

# Bounds of run()'s retry loop when neither the call nor the store sets them (FDB itself
# has none by default; a queue must not hang a caller forever). 100 retries with backoff
# capped at 1 s, or a minute in all, whichever comes first.
DEFAULT_RETRY_LIMIT = 100
DEFAULT_TIMEOUT_MS = 60_000

# FoundationDB error codes, by name.
TRANSACTION_TOO_OLD = 1007
FUTURE_VERSION = 1009
NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_CANCELLED = 1025
TRANSACTION_TIMED_OUT = 1031
ACCESSED_UNREADABLE = 1036
PROCESS_BEHIND = 1037
DATABASE_LOCKED = 1038
CLUSTER_VERSION_CHANGED = 1039
COMMIT_PROXY_MEMORY_LIMIT_EXCEEDED = 1042
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103
KEY_OUTSIDE_LEGAL_RANGE = 2004
INVALID_ARGUMENT = 2000

ERROR_NAMES: dict[int, str] = {
    TRANSACTION_TOO_OLD: "transaction_too_old",
    FUTURE_VERSION: "future_version",
    NOT_COMMITTED: "not_committed",
    COMMIT_UNKNOWN_RESULT: "commit_unknown_result",
    TRANSACTION_CANCELLED: "transaction_cancelled",
    TRANSACTION_TIMED_OUT: "transaction_timed_out",
    ACCESSED_UNREADABLE: "accessed_unreadable",
    PROCESS_BEHIND: "process_behind",
    DATABASE_LOCKED: "database_locked",
    CLUSTER_VERSION_CHANGED: "cluster_version_changed",
    COMMIT_PROXY_MEMORY_LIMIT_EXCEEDED: "commit_proxy_memory_limit_exceeded",
    TRANSACTION_TOO_LARGE: "transaction_too_large",
    KEY_TOO_LARGE: "key_too_large",
    VALUE_TOO_LARGE: "value_too_large",
    KEY_OUTSIDE_LEGAL_RANGE: "key_outside_legal_range",
    INVALID_ARGUMENT: "invalid_argument",
}

MAYBE_COMMITTED = frozenset({COMMIT_UNKNOWN_RESULT, CLUSTER_VERSION_CHANGED})
RETRYABLE_NOT_COMMITTED = frozenset(
    {
        NOT_COMMITTED,
        TRANSACTION_TOO_OLD,
        FUTURE_VERSION,
        DATABASE_LOCKED,
        PROCESS_BEHIND,
        COMMIT_PROXY_MEMORY_LIMIT_EXCEEDED,
    }
)
RETRYABLE = MAYBE_COMMITTED | RETRYABLE_NOT_COMMITTED


class VersionstampFuture(Protocol):
    """The 10-byte versionstamp of a transaction, ready after it commits."""

    def result(self) -> bytes: ...


@runtime_checkable
class KVTransaction(Protocol):
    """One transaction: reads at one snapshot, sees its own writes, commits atomically."""

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        """Value of ``key`` or None; adds a read conflict on it unless ``snapshot``."""
        ...

    def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """Pairs with ``begin <= key < end`` in key order (descending if ``reverse``).

        ``limit`` 0 means all; with ``reverse`` the last ``limit`` keys are returned. The read
        conflict range covers only what was needed to produce the answer.
        """
        ...

    def set(self, key: bytes, value: bytes) -> None: ...

    def clear(self, key: bytes) -> None: ...

    def clear_range(self, begin: bytes, end: bytes) -> None: ...

    def add(self, key: bytes, param: bytes) -> None:
        """Atomic little-endian add of ``param`` (no read conflict)."""
        ...

    def max(self, key: bytes, param: bytes) -> None:
        """Atomic unsigned little-endian max (no read conflict)."""
        ...

    def min(self, key: bytes, param: bytes) -> None:
        """Atomic unsigned little-endian min (no read conflict)."""
        ...

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """``key`` ends with a LE uint32 offset where the 10-byte versionstamp goes."""
        ...

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """``value`` ends with a LE uint32 offset where the 10-byte versionstamp goes."""
        ...

    def get_versionstamp(self) -> VersionstampFuture:
        """Call before commit; the future is ready after a successful commit."""
        ...

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None: ...

    def add_read_conflict_key(self, key: bytes) -> None: ...

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None: ...

    def add_write_conflict_key(self, key: bytes) -> None: ...

    def get_read_version(self) -> int: ...

    def commit(self) -> None:
        """Apply buffered writes atomically, or raise :class:`KVError`."""
        ...

    def on_error(self, error: KVError) -> None:
        """Back off and reset if ``error`` is retryable; otherwise re-raise it."""
        ...

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once this transaction has committed, in registration order.

        An attempt that fails, is reset or cancelled drops its callbacks: a retry that
        re-runs the body registers them again. The enqueue's part two runs this way, so it
        follows every commit of a caller's transaction, whoever commits it.
        """
        ...

    def reset(self) -> None: ...

    def set_timeout(self, millis: int) -> None: ...

    def set_retry_limit(self, limit: int) -> None: ...

    def set_causal_read_risky(self) -> None:
        """Hint that a slightly stale read version is acceptable (peeks, pointer leases)."""
        ...


@runtime_checkable
class KVStore(Protocol):
    """A database: hands out transactions."""

    url: str

    def create_transaction(self) -> KVTransaction: ...

    def close(self) -> None: ...


@runtime_checkable
class CommitCounter(Protocol):
    """An optional capability of a :class:`KVStore`: a cheap number that changes after
    a commit to the store that this store object did not make itself (another process's,
    another connection's); its own commits wake their waiters directly, if at all.

    ``data_version()`` must be cheap enough to call every millisecond (SQLite reads it
    from the WAL index in shared memory), or the store says in ``data_version_tick_s``
    how often at most (PostgreSQL: a round trip); it may also change when nothing
    visible did.
    The core finds it with :func:`commit_counter_of`, never by importing a backend:
    :mod:`quickzones.store.changes` turns it into wake-ups for long polls that would otherwise
    rescan at a fixed period to see another process's enqueues. A store whose commits all
    happen in this process (``memory://``) or that could use its own change feed (FDB
    watches) leaves it out.
    """

    def data_version(self) -> int: ...


def commit_counter_of(db: object) -> Callable[[], int] | None:
    """The store's :meth:`CommitCounter.data_version`, or None without the capability."""
    counter = getattr(db, "data_version", None)
    return counter if callable(counter) else None


def holds_commit_lock(tr: object) -> bool:
    """Whether ``tr`` holds the store's commit lock from its first read to its commit (an
    application's own transaction on SQLite or PostgreSQL, ``Quick.enqueue_on``): nothing
    else commits meanwhile, so what it reads cannot change before it commits and no read
    of it can make it abort."""
    return getattr(tr, "holds_commit_lock", False) is True


def commits_in_process(db: object) -> bool:
    """Whether ``db``'s transactions run and commit in this process with no server to wait
    for (SQLite's file, the memory store). Work a caller would hand to another thread to
    spare it a round trip gains nothing there, and on SQLite, one writer at a time, the
    caller's own commit would wait for that thread's anyway."""
    return getattr(db, "commits_in_process", False) is True


def joins_application_here(db: object) -> bool:
    """Whether a transaction ``db`` made now, on this thread, would write into an
    application's own open transaction (``Quick.enqueue_on`` under way on PostgreSQL):
    its locks would then last until the application's COMMIT; or would wait for a lock
    this thread holds (inside a native SQL write on SQLite). Work that is not the
    caller's own (the steady clock's floor exchange) waits for a later moment instead."""
    joins: Callable[[], bool] | None = getattr(db, "joins_application_here", None)
    return joins is not None and joins() is True


def joins_application(tr: object) -> bool:
    """Whether ``tr`` commits into an application's own open transaction whose locks last
    until the application's COMMIT (PostgreSQL's ``enqueue_on``)."""
    return getattr(tr, "joins_application", False) is True


def may_retry_in_place(tr: object, err: KVError) -> bool:
    """Whether run() may try ``tr`` again after ``err``: yes, unless it writes into an
    application's own transaction that cannot read newer commits (``can_retry_in_place``:
    PostgreSQL's at REPEATABLE READ or SERIALIZABLE)."""
    if not joins_application(tr):
        return True
    can_retry: Callable[[KVError], bool] | None = getattr(tr, "can_retry_in_place", None)
    return can_retry is not None and can_retry(err)


def commit_waiter_of(db: object) -> Callable[[float], None] | None:
    """The store's ``wait_for_commits(timeout_s)``, or None: an optional part of the
    :class:`CommitCounter` capability that blocks up to ``timeout_s`` and returns early
    when a commit may have been made (PostgreSQL: a NOTIFY each commit sends), so a
    watcher reads the counter then instead of at its next tick."""
    waiter = getattr(db, "wait_for_commits", None)
    return waiter if callable(waiter) else None


def read_after_commit(
    tr: object, keys: Sequence[bytes]
) -> Callable[[], list[bytes | None] | None] | None:
    """Ask ``tr`` to read ``keys`` once its commit's writes are in place, in the commit's
    own round trip (SQLite: under its write lock, before COMMIT; PostgreSQL: a statement
    pipelined after COMMIT), so that work which must follow the commit (the enqueue's part
    two) can often see it has nothing to do without a transaction of its own. Returns a
    call that gives the values (None for an absent key) once ``tr`` committed, or None
    when the backend did not read them (it cannot, or it did not commit); None instead of
    a call when the store has no such capability. What it returns is a read like any
    made just after the commit: other commits may follow it at once."""
    ask = getattr(tr, "read_after_commit", None)
    if not callable(ask):
        return None
    values: Callable[[], list[bytes | None] | None] = ask(keys)
    return values


@dataclass(frozen=True, slots=True)
class EarlierIfLater:
    """A rewrite the store makes at a commit (:func:`earlier_if_later`) where
    ``index_key`` still holds ``index`` and the record at ``key`` starts with ``head``
    followed by a msgpack uint64 (``0xcf`` and 8 bytes, big-endian) later than ``limit``:
    the record becomes ``record``, the key ``entry[0] + t + entry[1]`` (``t``: that uint64
    packed as an ``fdb.tuple`` integer) is cleared and ``new_entry`` set to ``b""``. The
    enqueue's part two in its part one's commit: an idle pointer's vesting time moved
    earlier, and its vesting entry with it."""

    index_key: bytes
    index: bytes
    key: bytes
    head: bytes
    limit: int
    record: bytes
    entry: tuple[bytes, bytes]
    new_entry: bytes

    def rewrites(self, value: bytes | None) -> bool:
        """Whether a record holding ``value`` would be rewritten."""
        size = len(self.head)
        if value is None or len(value) < size + 9 or not value.startswith(self.head):
            return False
        if value[size] != 0xCF:
            return False
        return int.from_bytes(value[size + 1 : size + 9], "big") > self.limit


def earlier_if_later(
    tr: object, make: Callable[[], EarlierIfLater | None], *, likely: bool = True
) -> bool:
    """Ask ``tr``'s store to make ``make()`` (an :class:`EarlierIfLater`, None: nothing)
    at ``tr``'s commit, as one step with it, reading the newest committed state under the
    commit's hold of the record's key: where made, its three keys count as written by the
    commit and it wakes watchers, as :func:`wake_watchers`; where not (the entry names
    another pointer, the record is leased, not laid out so, or vests in time) nothing is
    written nor counted as written, so the commit conflicts with no one for it. False
    where the store (or this try) cannot: the caller does it after the commit, as
    before; True does not say whether it was made (a read after the commit does).
    ``likely``: whether the caller expects it to be made (False: the store may leave out
    one that what it last read of the record, a moment ago, says would not be made)."""
    ask = getattr(tr, "earlier_if_later", None)
    return callable(ask) and bool(ask(make, likely))


def create_if_absent(
    tr: object,
    key: bytes,
    writes: Callable[[], Sequence[tuple[bytes, bytes]]],
    *,
    expect: Mapping[bytes, bytes | None],
    follow: tuple[bytes, bytes],
    wake: bool = False,
) -> Callable[[], tuple[bytes | None, bytes | None] | None] | None:
    """Ask ``tr`` to make ``writes()`` at its commit only where ``key`` is absent then, as
    one step with the commit (no commit touching ``key`` or those writes' keys comes
    between), and to fail the commit (retryably, as a read conflict) unless each key of
    ``expect`` still holds the value given (None: absent): what a transaction that reads
    those keys with conflicts and writes where ``key`` was absent does, without the read's
    round trip before the commit (PostgreSQL: the enqueue's pointer check made by the
    server). ``key`` and the writes' keys count as written by the commit for other
    transactions' checks, written or not. Returns a call that gives, once ``tr`` committed,
    ``key``'s value and that of the key ``follow[0] + value + follow[1]`` as read just
    after the commit (``key`` absent: (None, None); ``key``'s value equal to its write
    here: the writes were made), or None where they were not read; None instead of a
    call when the store (or this try) cannot, or where a read of ``key`` and ``expect``'s
    keys would cost this try no round trip (``writes`` is then not called), and the
    caller reads and writes itself. ``wake``: where the writes are made, as
    :func:`wake_watchers` (only then)."""
    ask = getattr(tr, "create_if_absent", None)
    if not callable(ask):
        return None
    values: Callable[[], tuple[bytes | None, bytes | None] | None] | None = ask(
        key, writes, expect, follow, wake
    )
    return values


def follow_in_commit(
    tr: object,
    follow: Callable[[KVTransaction], None],
    needed: Callable[[dict[bytes, bytes | None]], bool] | None = None,
) -> bool:
    """Ask ``tr``'s store to run ``follow`` as a transaction of its own that commits right
    after ``tr`` does, under the same hold of the store's write lock (SQLite), so that no
    other commit comes between them: its reads see ``tr``'s writes and the newest state,
    and it can neither conflict nor make ``tr`` fail (an error in it is logged and drops
    its writes alone). It runs only if ``tr`` commits, once per attempt that does. True
    when the store took it; False when it cannot, and the caller follows the commit
    another way (:meth:`KVTransaction.on_commit`). ``needed``: asked first with the
    values of the keys ``tr`` asked to read after its commit (:func:`read_after_commit`),
    where the store has them; False skips ``follow`` (no transaction is made for it)."""
    ask = getattr(tr, "follow_in_commit", None)
    return callable(ask) and bool(ask(follow, needed))


def relax_durability(tr: object) -> None:
    """Let ``tr``'s commit return before the store has made it durable, where the store
    can (PostgreSQL: ``synchronous_commit = off`` for that transaction alone); elsewhere
    nothing. Only for writes that a crash of the store's server may undo without harm:
    a consumer's visit (its pointer lease and requeue, its items' leases), which such a
    crash puts back as they were before it, so its items run again (at least once; a
    transactional handler's completion then finds its lease gone and its effects roll
    back). Its writes are seen by other transactions at once, as any commit's, and a
    durable commit made after it makes it durable too (the server's log is flushed in
    order). An enqueue's part one and a completion never relax; its part two, best effort
    already, does: a crash that undoes it leaves the pointer vesting later, as a producer
    killed before part two does."""
    relax = getattr(tr, "relax_durability", None)
    if callable(relax):
        relax()


def follows_own_commit(tr: object, read: Mapping[bytes, bytes | None]) -> None:
    """Tell ``tr``, a transaction that follows a commit of this process whose round trip
    read ``read`` just after its COMMIT (:func:`read_after_commit`: an enqueue's part
    two), that its first read of those keys may be answered from what the store kept of
    them (PostgreSQL's kept snapshots, ``known_reads.py``) before ``tr`` wrote anything,
    where the kept values are those of ``read``: ``tr`` then decides as the caller's look
    just after that commit did, and a commit of ``tr`` is checked against the kept
    snapshot like any read's. Elsewhere nothing."""
    follows = getattr(tr, "follows_own_commit", None)
    if callable(follows):
        follows(read)


def wake_watchers(tr: object) -> None:
    """Ask that other processes' commit watchers hear of ``tr``'s commit at once (a
    zone's pointer was made or moved to vest earlier: an idle consumer or long poll
    elsewhere has work), where the store can tell them (PostgreSQL: a NOTIFY with the
    commit, :func:`commit_waiter_of`); elsewhere nothing."""
    wake = getattr(tr, "wake_watchers_on_commit", None)
    if callable(wake):
        wake()


def commit_counter_tick_of(db: object) -> float:
    """The shortest tick the store's commit counter may be read at (0: any)."""
    tick = getattr(db, "data_version_tick_s", 0.0)
    return float(tick) if isinstance(tick, int | float) else 0.0


def retry_bounds(
    db: object, retry_limit: int | None = None, timeout_ms: int | None = None
) -> tuple[int, int]:
    """(retry limit, timeout in ms) of :func:`run` on ``db``: the arguments if given, else
    the store's ``retry_limit``/``timeout_ms`` (URL options), else the defaults."""
    # FDBStore keeps its URL options in ``options``; the buffered stores as attributes.
    options = getattr(db, "options", None)
    if retry_limit is None:
        retry_limit = getattr(db, "retry_limit", None)
        if retry_limit is None:
            retry_limit = getattr(options, "retry_limit", None)
    if timeout_ms is None:
        timeout_ms = getattr(db, "timeout_ms", None)
        if timeout_ms is None:
            timeout_ms = getattr(options, "timeout_ms", None)
    return (
        DEFAULT_RETRY_LIMIT if retry_limit is None else retry_limit,
        DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms,
    )


def run(
    db: KVStore | KVTransaction,
    fn: Callable[[KVTransaction], T],
    *,
    on_retry: Callable[[KVError], None] | None = None,
    retry_limit: int | None = None,
    timeout_ms: int | None = None,
) -> T:
    """Run ``fn(tr)`` to commit, retrying on retryable errors, like ``@fdb.transactional``.

    Given a transaction, just calls ``fn`` inside it (no commit, no retry), so storage
    functions compose into one atomic commit. Given a store, creates one transaction and
    re-runs ``fn`` after each retryable error. Note that ``commit_unknown_result`` is retried
    too, so ``fn`` must be idempotent or tolerate running twice; ``on_retry(error)`` is told
    of each error before the retry (e.g. to remember what a maybe-committed attempt did).

    The loop is bounded like FDB's ``retry_limit`` and ``timeout`` transaction options
    (see :func:`retry_bounds`): past either it raises :class:`RetryLimitExceeded`. Failures
    no retry can fix end it early: :class:`TransactionTooLong` when two attempts in a row
    outlived the 5 s lifetime, :class:`TransactionTooLarge` over the size limit; backends
    raise ``StoreFull`` and ``StoreBusy`` themselves.
    """
    # A duck-typed test, not isinstance(): checking a runtime Protocol costs tens of
    # microseconds, and run() is on every hot path.
    create = getattr(db, "create_transaction", None)
    if create is None:
        return fn(db)  # type: ignore[arg-type]
    limit, timeout = retry_bounds(db, retry_limit, timeout_ms)
    # The store's clock, so a simulated store's manual time drives the deadline too.
    clock = getattr(db, "clock", None)
    now: Callable[[], float] = clock.now if clock is not None else time.monotonic
    tr: KVTransaction = create()
    if timeout > 0:
        # Also bounds a single attempt that blocks (FDB reads wait for an unreachable
        # cluster forever); the timeout counts from creation and survives on_error.
        tr.set_timeout(timeout)
    started = now()
    attempts = 0
    too_long = 0  # attempts in a row that outlived the transaction lifetime
    while True:
        attempts += 1
        attempt_started = now()
        try:
            result = fn(tr)
            tr.commit()
            return result
        except KVError as err:
            if holds_commit_lock(tr) or not may_retry_in_place(tr, err):
                # The application's own transaction (it failed, or its snapshot is too
                # old): only the application can roll it back and run it again.
                raise
            elapsed = now() - started
            attempt_s = now() - attempt_started
            too_long = too_long + 1 if _outlived(err, attempt_s) else 0
            hopeless = _hopeless(err, attempt_s, too_long, attempts, elapsed, timeout)
            if hopeless is not None:
                raise hopeless from err
            if err.retryable and (attempts > limit or (timeout > 0 and elapsed * 1000 >= timeout)):
                bound = {"retry_limit": limit} if attempts > limit else {}
                raise RetryLimitExceeded(
                    attempts, elapsed, err, timeout_s=timeout / 1000, **bound
                ) from err
            try:
                tr.on_error(err)  # raises what is not retryable
            except KVError as final:
                if final.retryable:
                    # The transaction's own retry limit (set_retry_limit, or an FDB
                    # database option) ran out first.
                    raise RetryLimitExceeded(
                        attempts, now() - started, final, retry_limit=attempts - 1
                    ) from final
                raise
            if on_retry is not None:
                on_retry(err)


class _OwnStore:
    """The default of a :func:`transactional` function's ``tr``: the object's own store."""

    def __repr__(self) -> str:
        return "OWN_STORE"


OWN_STORE: Any = _OwnStore()
"""Default for the ``tr`` keyword of a :func:`transactional` method: leave ``tr`` out and
the method runs in a transaction of its own on ``self.kv``."""


class _Uncommitted:
    """The result of :func:`attempt_once` when its one attempt failed retryably."""


UNCOMMITTED = _Uncommitted()


def attempt_once(db: KVStore, fn: Callable[[KVTransaction], T]) -> T | _Uncommitted:
    """Run ``fn(tr)`` in one transaction of ``db`` and commit it, with no retry: a
    retryable error (a conflict, most often) returns :data:`UNCOMMITTED` at once, without
    the backoff :func:`run` sleeps, so the caller can take another way (a one-transaction
    visit falls back to the paper's three). A commit_unknown_result may have committed.
    Other errors, and exceptions ``fn`` raises, propagate; the transaction is reset."""
    tr = db.create_transaction()
    committed = False
    try:
        result = fn(tr)
        tr.commit()
        committed = True
        return result
    except KVError as err:
        if err.retryable:
            return UNCOMMITTED
        raise
    finally:
        if not committed:
            tr.reset()  # drops its snapshot (a pooled SQLite connection) now


def transactional(fn: Callable[P, T]) -> Callable[P, T]:
    """One spelling per storage operation, like the FoundationDB binding's
    ``@fdb.transactional``: ``fn`` takes its transaction as the keyword-only ``tr``.

    * given a :class:`KVStore` (``tr=store``), :func:`run` opens a transaction, re-runs
      ``fn`` on retryable errors and commits;
    * given a :class:`KVTransaction` (``tr=tr``), ``fn`` runs inside it and nothing is
      committed, so operations compose into the caller's one atomic commit;
    * on a method (first parameter ``self``), leaving ``tr`` out (or ``None``) means the
      object's own store, ``self.kv``.

    So ``zones.complete(zone, item_id, lease_id)`` and ``zones.complete(zone, item_id,
    lease_id, tr=tr)`` are one operation, written once, instead of a ``complete_in(tr, ...)``
    and a ``complete(...)`` that wraps it. ``fn`` may run more than once (see :func:`run`).
    """
    params = inspect.signature(fn).parameters
    tr_param = params.get("tr")
    if tr_param is None or tr_param.kind is not inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(
            f"@transactional {fn.__qualname__}: needs a keyword-only parameter 'tr' "
            "(def f(..., *, tr: KVTransaction = OWN_STORE))"
        )
    method = next(iter(params)) == "self"

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        db: Any = kwargs.get("tr")
        if db is None or db is OWN_STORE:
            if not method or not args:
                raise TypeError(
                    f"{fn.__qualname__}() needs tr=: a KVStore to run in a transaction of "
                    "its own, or a KVTransaction to join"
                )
            db = args[0].kv  # type: ignore[attr-defined,unused-ignore]

        def attempt(tr: KVTransaction) -> T:
            kwargs["tr"] = tr
            return fn(*args, **kwargs)

        return run(db, attempt)  # a transaction: just called inside it

    return call


def _outlived(err: KVError, attempt_s: float) -> bool:
    """Whether an attempt failed as too old because its own body ran past the lifetime
    (not an injected or lagging 1007 on a quick body)."""
    return err.code == TRANSACTION_TOO_OLD and attempt_s > TRANSACTION_LIFETIME_S


def _hopeless(
    err: KVError,
    attempt_s: float,
    too_long: int,
    attempts: int,
    elapsed_s: float,
    timeout_ms: int,
) -> StorageError | None:
    """The clear error for a failure that retrying the same body cannot fix, or None."""
    if err.code == TRANSACTION_TOO_LARGE:
        return TransactionTooLarge(err.size, TRANSACTION_SIZE_LIMIT)
    if too_long >= 2:
        # One slow attempt is forgiven (a pause, a cold cache); a body that outlives the
        # lifetime twice in a row would fail the same way every time.
        return TransactionTooLong(attempt_s, TRANSACTION_LIFETIME_S)
    if err.code == TRANSACTION_TIMED_OUT:
        return RetryLimitExceeded(attempts, elapsed_s, err, timeout_s=timeout_ms / 1000)
    return None


def pack_i64(value: int) -> bytes:
    """8-byte little-endian signed integer, the parameter shape of atomic add."""
    return struct.pack("<q", value)


def unpack_i64(raw: bytes | None) -> int:
    """Reads a counter written by atomic add; absent means zero."""
    if raw is None:
        return 0
    return int.from_bytes(raw.ljust(8, b"\x00")[:8], "little", signed=True)


def strinc(prefix: bytes) -> bytes:
    """First key after every key that starts with ``prefix`` (FDB's ``strinc``)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        raise ValueError("a key of only 0xff bytes has no successor prefix")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def key_after(key: bytes) -> bytes:
    """The smallest key greater than ``key``."""
    return key + b"\x00"


def get_many(tr: KVTransaction, keys: Sequence[bytes]) -> list[bytes | None]:
    """Values of ``keys`` (read conflicts on each, as ``get``), in one call where the
    store's transaction has a ``get_many`` method (FoundationDB sends the reads in
    parallel, SQLite reads them in one statement); one ``get`` after another elsewhere."""
    many = getattr(tr, "get_many", None)
    if many is not None:
        result: list[bytes | None] = many(keys)
        return result
    return [tr.get(k) for k in keys]


def prefetch(tr: KVTransaction, keys: Sequence[bytes]) -> None:
    """Warm ``tr``'s read cache with ``keys`` in one round trip where the store reads in
    parallel (FoundationDB's transaction answers a key it read again locally); nothing
    elsewhere. Adds the read conflicts the caller's own reads would."""
    many = getattr(tr, "get_many", None)
    if many is not None:
        many(keys)


def reads_ahead(tr: KVTransaction) -> bool:
    """Whether ``tr`` can send several first reads in one round trip (:func:`read_ahead`:
    PostgreSQL's transactions); elsewhere a read ahead would only move reads earlier."""
    return getattr(tr, "read_ahead", None) is not None


def read_ahead(
    tr: KVTransaction, keys: Sequence[bytes], ranges: Sequence[tuple[bytes, bytes, int]]
) -> None:
    """Where ``tr`` can (:func:`reads_ahead`), read ``keys`` and the first ``limit`` pairs
    of each ``(begin, end, limit)`` of ``ranges`` from storage in one round trip, and
    answer the transaction's later reads inside them locally (each still adds its read
    conflicts; the read ahead adds none): for reads a caller knows it will make one after
    another (a zone visit: the pointer's record, then the zone). Nothing elsewhere."""
    ahead = getattr(tr, "read_ahead", None)
    if ahead is not None:
        ahead(keys, ranges)


def prefetch_range(tr: KVTransaction, begin: bytes, end: bytes, limit: int) -> bool | None:
    """Where the transaction can (a ``prefetch_range`` method: the SQLite and in-memory
    backends), read ``[begin, end)`` in one storage read if it holds at most ``limit``
    pairs, and answer the transaction's later reads inside it locally (each still adds
    its read conflicts); elsewhere nothing (FoundationDB's client caches what it read).
    Whether the range was kept (False: it held more than ``limit`` pairs); None where the
    store does not prefetch."""
    ahead = getattr(tr, "prefetch_range", None)
    if ahead is None:
        return None
    return bool(ahead(begin, end, limit))

"""The KV seam: an ordered, transactional key-value interface shaped like FoundationDB's.

All of QuiCK's storage logic is written once against :class:`KVTransaction`. Each backend
(``backends.memory``, ``backends.sqlite``, ``backends.fdb``) implements it with the
semantics of ``shared/fdb-semantics.md``:

* a transaction reads at one read version and sees its own writes (including range reads
  over uncommitted sets and clears);
* non-snapshot reads add read conflict ranges; at commit the transaction fails with
  ``not_committed`` (1020) if a transaction that committed after its read version wrote a
  key in one of them; snapshot reads add none;
* writes are buffered and applied atomically at commit.

Storage functions take ``tr`` first and never commit; :func:`run` owns commit and retry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

from quick_core.errors import StorageError

T = TypeVar("T")

# FoundationDB's limits (fdb-semantics.md section 1).
KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
TRANSACTION_SIZE_LIMIT = 10_000_000
TRANSACTION_LIFETIME_S = 5.0

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


class KVError(StorageError):
    """A store error carrying FoundationDB's error code."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code = code
        self.name = ERROR_NAMES.get(code, f"error_{code}")
        msg = f"{self.name} ({code})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg, retryable=code in RETRYABLE)
        self.maybe_committed = code in MAYBE_COMMITTED


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


def run(
    db: KVStore | KVTransaction,
    fn: Callable[[KVTransaction], T],
    *,
    on_retry: Callable[[KVError], None] | None = None,
) -> T:
    """Run ``fn(tr)`` to commit, retrying on retryable errors, like ``@fdb.transactional``.

    Given a transaction, just calls ``fn`` inside it (no commit, no retry), so storage
    functions compose into one atomic commit. Given a store, creates one transaction and
    re-runs ``fn`` after each retryable error. Note that ``commit_unknown_result`` is retried
    too, so ``fn`` must be idempotent or tolerate running twice; ``on_retry(error)`` is told
    of each error before the retry (e.g. to remember what a maybe-committed attempt did).
    """
    # A duck-typed test, not isinstance(): checking a runtime Protocol costs tens of
    # microseconds, and run() is on every hot path.
    create = getattr(db, "create_transaction", None)
    if create is None:
        return fn(db)  # type: ignore[arg-type]
    tr: KVTransaction = create()
    while True:
        try:
            result = fn(tr)
            tr.commit()
            return result
        except KVError as err:
            tr.on_error(err)  # raises what is not retryable
            if on_retry is not None:
                on_retry(err)


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

"""A buffered transaction's state: the storage half a backend supplies, the buffers
(reset on retry), and the checks every call makes against them."""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from quickzones.backends._ranges import Range, RangeSet
from quickzones.backends.txnbuffer.buffer import KeyValue, _Point, _VersionstampedKey
from quickzones.backends.txnbuffer.checks import USED_DURING_COMMIT
from quickzones.backends.txnbuffer.commit_request import (
    CommitRequest,
    Follower,
    _VersionstampFuture,
)
from quickzones.clock import Clock
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    TRANSACTION_CANCELLED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TIMED_OUT,
    TRANSACTION_TOO_OLD,
    KVError,
)

_OPEN = "open"
_COMMITTED = "committed"
_CANCELLED = "cancelled"
_TIMED_OUT = "timed_out"
_FAILED = "failed"


class TxnState(ABC):
    """The state of a buffered transaction and its storage half; its reads, writes and
    conflict ranges are mixins of it, each in a module of its own."""

    _clock: Clock
    _now: Callable[[], float]  # the clock's reading (quickzones.clock.now_reader)
    _read_version: int | None  # set by _reset_state, then by the first read
    # Set by BufferedTransaction._reset_options, read by the open check.
    _timeout_s: float
    _started: float

    # --- storage half, supplied by the backend ------------------------------------------

    @abstractmethod
    def _acquire_read_version(self) -> int:
        """Open a storage snapshot and return its version."""

    @abstractmethod
    def _read_key(self, key: bytes) -> bytes | None:
        """Value at the read version; raises 1007 if the snapshot is too old."""

    def _read_version_and_keys(self, keys: Sequence[bytes]) -> tuple[int, list[bytes | None]]:
        """Open the storage snapshot and read ``keys`` at it: (its version, their values
        in order); a backend that can do both in one storage call overrides this."""
        self._read_version = version = self._acquire_read_version()
        return version, self._read_keys(keys)

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` at the read version, in order; a backend that can answer
        them in one storage call overrides this."""
        return [self._read_key(key) for key in keys]

    @abstractmethod
    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        """Up to ``limit`` (0 = all) pairs at the read version, in scan order."""

    @abstractmethod
    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        """Check conflicts and apply; returns (commit version, batch order) or raises."""

    @abstractmethod
    def _random(self) -> float:
        """A uniform draw in [0, 1) for backoff jitter (seeded on the simulator)."""

    def _release(self) -> None:  # noqa: B027 - optional hook, most backends hold no snapshot
        """Drop the storage snapshot, if any (called on commit, reset and on_error)."""

    def _reset_state(self) -> None:
        self._state = _OPEN
        self._on_commit: list[Callable[[], None]] = []
        self._wakes_watchers = False
        self._read_after: list[bytes] = []
        self._followers: list[Follower] = []
        self._read_after_values: dict[bytes, bytes | None] | None = None
        self._error: KVError | None = None
        self._points: dict[bytes, _Point] = {}
        self._point_keys: list[bytes] = []
        # None until the first clear_range: most transactions clear no range, and an
        # empty set's truth test is a Python call at each read and write.
        self._cleared: RangeSet | None = None
        self._clear_log: list[tuple[int, bytes, bytes]] = []
        self._vs_keys: list[_VersionstampedKey] = []
        # The smallest range holding every versionstamped key's possible final places: most
        # reads fall outside it and skip the per-key check (a batch of FIFO enqueues makes
        # one per item).
        self._vs_span: Range = (b"\xff", b"")
        self._read_cache: dict[bytes, bytes | None] = {}
        # Whole storage ranges read ahead (prefetch_range): (begin, end, keys, pairs).
        self._range_cache: list[tuple[bytes, bytes, list[bytes], list[KeyValue]]] = []
        self._read_conflicts: list[Range] = []
        self._write_conflicts: list[Range] = []
        self._seq = 0
        self._mutation_bytes = 0
        self._conflict_bytes = 0
        self._read_version = None
        self._read_time = 0.0
        self._committed_version = -1
        self._versionstamp = _VersionstampFuture()

    def _check_open(self) -> None:
        if self._state is not _OPEN:
            if self._state is _COMMITTED:
                raise KVError(USED_DURING_COMMIT, "transaction already committed; reset() it")
            if self._state is _CANCELLED:
                raise KVError(TRANSACTION_CANCELLED, "transaction was cancelled; reset() it")
            if self._state is _FAILED and self._error is not None:
                # Its snapshot is gone after a failed commit; on_error() or reset() revives it.
                raise self._error
            raise KVError(TRANSACTION_TIMED_OUT, "transaction timed out; reset() it")
        if self._timeout_s and self._now() - self._started >= self._timeout_s:
            self._state = _TIMED_OUT
            self._release()
            raise KVError(TRANSACTION_TIMED_OUT, f"timeout of {self._timeout_s:.3f} s elapsed")

    def _ensure_read_version(self) -> None:
        if self._read_version is None:
            self._read_time = self._now()
            self._read_version = self._acquire_read_version()

    def _check_too_old(self, now: float) -> None:
        """Raise 1007 when the read version is older than the 5 s lifetime."""
        if self._read_version is not None and now - self._read_time > TRANSACTION_LIFETIME_S:
            raise KVError(
                TRANSACTION_TOO_OLD,
                f"read version is {now - self._read_time:.2f} s old (limit "
                f"{TRANSACTION_LIFETIME_S:.0f} s)",
            )

    def _check_readable(self, begin: bytes, end: bytes) -> None:
        if not (self._vs_span[0] < end and begin < self._vs_span[1]):
            return
        for vs in self._vs_keys:
            if vs.unreadable[0] < end and begin < vs.unreadable[1]:
                raise KVError(ACCESSED_UNREADABLE, "range holds a versionstamped key of this txn")

    def _put_point(self, key: bytes, point: _Point) -> None:
        if key not in self._points:
            bisect.insort(self._point_keys, key)
        self._points[key] = point

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

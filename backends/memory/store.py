"""MemoryStore: a seeded, deterministic in-process simulator of FoundationDB.

Semantics follow ``docs/fdb-semantics.md``: MVCC reads at the read version, read-your-
writes (``quickzones.backends.txnbuffer``), optimistic conflict checks at commit against the write
conflict ranges of transactions that committed after the read version, the 5 s lifetime
(1007) on the store's clock, and ``on_error`` backoff slept through that clock.

Versions advance about 1e6 per second of the clock (commit version = max(last + 1, clock in
microseconds)), so with a ManualClock that never moves each commit adds one.

The store has no threads; one lock makes it safe for the consumer's threads. Every random
choice (injected faults and backoff jitter) comes from one ``random.Random(seed)``, so a
single-threaded run is reproducible from the seed.
"""

from __future__ import annotations

import bisect
import random
import threading
from collections.abc import Callable
from typing import ClassVar

from quickzones.backends._ranges import Range, merge_ranges, ranges_intersect
from quickzones.backends._versionstamps import make_versionstamp
from quickzones.backends.memory.faults import FAULT_KINDS, FaultConfig, parse_memory_url
from quickzones.backends.memory.mvcc import VersionedMap
from quickzones.backends.txnbuffer import (
    VERSIONS_PER_SECOND,
    BufferedTransaction,
    CommitRequest,
    KeyValue,
)
from quickzones.clock import Clock, SystemClock
from quickzones.errors import StorageError
from quickzones.store.kv import (
    COMMIT_UNKNOWN_RESULT,
    NOT_COMMITTED,
    TRANSACTION_LIFETIME_S,
    TRANSACTION_TOO_OLD,
    KVError,
)

# ``hook(request, commit) -> commit(request)``: see ``MemoryStore(commit_hook=...)``.
CommitHook = Callable[[CommitRequest, Callable[[CommitRequest], tuple[int, int]]], tuple[int, int]]


class MemoryStore:
    """An in-process FDB simulator: ``MemoryStore(seed=7, clock=ManualClock())``.

    ``fault_counts`` counts injected faults by kind (see ``FAULT_KINDS``); ``stats`` counts
    commits and real conflicts / too-old rejections.
    """

    # No server: a transaction costs no round trip (kv.commits_in_process).
    commits_in_process = True
    # Named stores (memory://name) shared within the process.
    _shared: ClassVar[dict[str, MemoryStore]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        *,
        seed: int = 0,
        clock: Clock | None = None,
        faults: FaultConfig | None = None,
        url: str = "memory://",
        commit_hook: CommitHook | None = None,
        retry_limit: int | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        self.url = url
        # Wraps every commit that reaches the store: ``hook(request, commit)`` must call
        # ``commit(request)`` and return its result. The simulation runs other actors there,
        # where a transaction's reads are done and its writes not yet visible.
        self.commit_hook = commit_hook
        # Bounds of quickzones.store.kv.run() on this store (None: its defaults).
        self.retry_limit = retry_limit
        self.timeout_ms = timeout_ms
        self.seed = seed
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.faults = faults if faults is not None else FaultConfig()
        self.fault_counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        self.stats: dict[str, int] = {"commits": 0, "conflicts": 0, "too_old": 0}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._data = VersionedMap()
        self._version = 0
        # Recent commits, oldest first: commit version, clock time, merged write ranges.
        self._recent_versions: list[int] = []
        self._recent_times: list[float] = []
        self._recent_writes: list[list[Range]] = []
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, *, commit_hook: CommitHook | None = None
    ) -> MemoryStore:
        """``memory://`` opens a fresh store; ``memory://name`` shares one per process.

        ``commit_hook`` (a fresh store only) wraps every commit, as the constructor's.

        Query options: ``seed``, ``fault_not_committed``, ``fault_unknown_result``,
        ``fault_unknown_result_applied``, ``fault_too_old`` (probabilities per commit),
        ``latency_ms``, and run()'s bounds ``retry_limit`` and ``timeout_ms``. A shared
        store keeps the options and clock of its first opening.
        """
        parsed = parse_memory_url(url)

        def new() -> MemoryStore:
            return cls(
                seed=parsed.seed,
                clock=clock,
                faults=parsed.faults,
                url=url,
                retry_limit=parsed.retry_limit,
                timeout_ms=parsed.timeout_ms,
                commit_hook=commit_hook,
            )

        if not parsed.name:
            return new()
        with cls._shared_lock:
            store = cls._shared.get(parsed.name)
            if store is None:
                store = new()
                cls._shared[parsed.name] = store
            return store

    @classmethod
    def forget_shared(cls, name: str | None = None) -> None:
        """Drop one named store (or all) from the process registry; for tests."""
        with cls._shared_lock:
            if name is None:
                cls._shared.clear()
            else:
                cls._shared.pop(name, None)

    def create_transaction(self) -> MemoryTransaction:
        if self._closed:
            raise StorageError(f"store {self.url} is closed")
        return MemoryTransaction(self)

    def close(self) -> None:
        """Close an unnamed store; a named one stays open for its other users."""
        if self not in self._shared.values():
            self._closed = True

    # --- inspection helpers for tests and invariant checkers -----------------------------

    def snapshot_items(self) -> dict[bytes, bytes]:
        """The whole committed state, newest version of every key, in key order."""
        with self._lock:
            return self._data.items()

    @property
    def committed_version(self) -> int:
        with self._lock:
            return self._version

    # --- called by MemoryTransaction --------------------------------------------------------

    def _random(self) -> float:
        with self._lock:
            return self._rng.random()

    def _commit(self, request: CommitRequest) -> tuple[int, int]:
        if self.faults.latency_ms:
            self.clock.sleep(self.faults.latency_ms / 1000.0)  # outside the lock on purpose
        with self._lock:
            if self.faults.latency_ms:
                self.fault_counts["latency"] += 1
            # Always four draws per commit so the fault sequence depends only on the seed
            # and the order of commits, not on which faults fired.
            draws = [self._rng.random() for _ in range(4)]
            now = self.clock.now()
            if request.too_old(now):
                self.stats["too_old"] += 1
                raise KVError(TRANSACTION_TOO_OLD, "read version older than 5 s at commit")
            if request.read_version is not None and self._conflicts(request):
                self.stats["conflicts"] += 1
                raise KVError(NOT_COMMITTED, "a read conflicts with a later commit")
            faults = self.faults
            if draws[0] < faults.too_old:
                self.fault_counts["too_old"] += 1
                raise KVError(TRANSACTION_TOO_OLD, "injected fault")
            if draws[1] < faults.not_committed:
                self.fault_counts["not_committed"] += 1
                raise KVError(NOT_COMMITTED, "injected fault")
            unknown = draws[2] < faults.unknown_result
            if unknown and draws[3] >= faults.unknown_result_applied:
                self.fault_counts["unknown_result_not_applied"] += 1
                raise KVError(COMMIT_UNKNOWN_RESULT, "injected fault (not applied)")
            version = self._apply(request, now)
            if unknown:
                self.fault_counts["unknown_result_applied"] += 1
                raise KVError(COMMIT_UNKNOWN_RESULT, "injected fault (applied)")
            return version, 0

    def _conflicts(self, request: CommitRequest) -> bool:
        if not request.read_conflicts:
            return False
        assert request.read_version is not None
        start = bisect.bisect_right(self._recent_versions, request.read_version)
        return any(
            ranges_intersect(request.read_conflicts, writes)
            for writes in self._recent_writes[start:]
        )

    def _apply(self, request: CommitRequest, now: float) -> int:
        version = max(self._version + 1, int(now * VERSIONS_PER_SECOND))
        writes = request.resolve(make_versionstamp(version, 0), self._data.latest)
        self._data.apply(writes, version)
        conflict_ranges = request.write_conflicts
        if writes.extra_write_conflicts:
            conflict_ranges = merge_ranges(conflict_ranges + writes.extra_write_conflicts)
        self._recent_versions.append(version)
        self._recent_times.append(now)
        self._recent_writes.append(conflict_ranges)
        self._version = version
        self.stats["commits"] += 1
        self._forget_old(now)
        return version

    def _forget_old(self, now: float) -> None:
        """Drop conflict history no live transaction can need.

        A transaction that still passes the 5 s check took its read version after every
        commit older than the cutoff, so those commits are at or below its read version.
        """
        cutoff = now - TRANSACTION_LIFETIME_S
        times = self._recent_times
        n = 0
        while n < len(times) and times[n] < cutoff:
            n += 1
        if n:
            self._data.horizon = self._recent_versions[n - 1]
            del self._recent_versions[:n]
            del self._recent_times[:n]
            del self._recent_writes[:n]


class MemoryTransaction(BufferedTransaction):
    """A transaction on a :class:`MemoryStore`; see :mod:`quickzones.backends.txnbuffer`."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        super().__init__(store.clock)

    def _acquire_read_version(self) -> int:
        with self._store._lock:
            return self._store._version

    def _read_key(self, key: bytes) -> bytes | None:
        store = self._store
        with store._lock:
            # Checked under the lock: history pruning relies on too-old readers stopping.
            self._check_too_old(store.clock.now())
            assert self._read_version is not None
            return store._data.get(key, self._read_version)

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        store = self._store
        with store._lock:
            self._check_too_old(store.clock.now())
            assert self._read_version is not None
            # Let the sweep horizon follow the clock on read-only stretches too.
            store._forget_old(store.clock.now())
            return store._data.scan(begin, end, self._read_version, limit, reverse)

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        store = self._store
        if store.commit_hook is not None:
            return store.commit_hook(request, store._commit)
        return store._commit(request)

    def _random(self) -> float:
        return self._store._random()

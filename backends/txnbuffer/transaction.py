"""The buffered transaction: versions, commit, retry and options, over its reads and
writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quickzones.backends._ranges import Range, merge_ranges
from quickzones.backends.txnbuffer.commit_request import CommitRequest
from quickzones.backends.txnbuffer.reads import BufferedReads
from quickzones.backends.txnbuffer.state import _CANCELLED, _COMMITTED, _FAILED
from quickzones.backends.txnbuffer.writes import BufferedWrites
from quickzones.clock import Clock, now_reader
from quickzones.errors import InvalidArgument
from quickzones.store.kv import (
    FUTURE_VERSION,
    TRANSACTION_SIZE_LIMIT,
    TRANSACTION_TOO_LARGE,
    TRANSACTION_TOO_OLD,
    KVError,
)

# Versions advance ~1e6 per second, so the 5 s lifetime is 5,000,000 versions.
VERSIONS_PER_SECOND = 1_000_000
# Backoff of tr.on_error (NativeAPI): fixed for too_old/future_version, else jittered and
# doubling from INITIAL_BACKOFF_S up to the max retry delay.
INITIAL_BACKOFF_S = 0.01
FIXED_BACKOFF_S = 0.01
DEFAULT_MAX_RETRY_DELAY_S = 1.0


class BufferedTransaction(BufferedReads, BufferedWrites):
    """A KVTransaction whose client half is implemented here; subclasses add storage.

    Not thread-safe: like an FDB ``Transaction``, one thread uses it at a time.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._now = now_reader(clock)
        self._reset_options()
        self._reset_state()

    def _reset_options(self) -> None:
        self._timeout_s = 0.0
        self._retry_limit = -1
        self._max_retry_delay_s = DEFAULT_MAX_RETRY_DELAY_S
        self._retries = 0
        self._backoff_s = INITIAL_BACKOFF_S
        # Set by the storage half when a commit failed only because its try read values
        # the store kept from an earlier snapshot, and the next try reads afresh.
        self._retry_at_once = False
        # The timeout counts from creation or reset(), not from on_error (API >= 610).
        self._started = self._now()

    def get_read_version(self) -> int:
        self._check_open()
        self._ensure_read_version()
        assert self._read_version is not None
        return self._read_version

    def get_committed_version(self) -> int:
        """Commit version after a successful commit; -1 for read-only or uncommitted."""
        return self._committed_version

    def _write_conflict_ranges(self) -> list[Range]:
        ranges = [(k, k + b"\x00") for k in self._point_keys]  # (k, key_after(k))
        if self._cleared is None and not self._write_conflicts:
            # Point writes alone (an enqueue's): their keys are kept in order.
            return merge_ranges(ranges, in_order=True)
        if self._cleared is not None:
            ranges.extend(self._cleared)
        ranges.extend(self._write_conflicts)
        return merge_ranges(ranges)

    def commit(self) -> None:
        self._check_open()
        cleared = self._cleared is not None
        if not (self._points or cleared or self._vs_keys or self._write_conflicts):
            # Read-only: nothing to send, never conflicts, no commit version.
            self._state = _COMMITTED
            self._versionstamp._read_only_commit()
            self._release()
            self._run_on_commit()
            return
        write_conflicts = self._write_conflict_ranges()
        size = self._mutation_bytes + self._conflict_bytes
        for begin, end in write_conflicts:
            size += len(begin) + len(end)
        if size > TRANSACTION_SIZE_LIMIT:
            raise KVError(
                TRANSACTION_TOO_LARGE,
                f"{size} bytes of mutations and conflict ranges exceed {TRANSACTION_SIZE_LIMIT}",
                size=size,
            )
        request = CommitRequest(
            read_version=self._read_version,
            read_time=self._read_time,
            read_conflicts=merge_ranges(self._read_conflicts),
            write_conflicts=write_conflicts,
            _points=self._points,
            _cleared=self._cleared,
            _clear_log=self._clear_log,
            _vs_keys=self._vs_keys,
            wakes_watchers=self._wakes_watchers,
            read_after=self._read_after,
            followers=self._followers,
        )
        try:
            version, batch_order = self._commit_request(request)
        except KVError as err:
            self._versionstamp._fail(err)
            self._state = _FAILED
            self._error = err
            raise
        finally:
            self._release()
        self._committed_version = version
        self._read_after_values = request.read_after_values
        self._versionstamp._set(version, batch_order)
        self._state = _COMMITTED
        self._run_on_commit()

    def wake_watchers_on_commit(self) -> None:
        """See :func:`quickzones.store.kv.wake_watchers`."""
        self._wakes_watchers = True

    def read_after_commit(self, keys: Sequence[bytes]) -> Callable[[], list[bytes | None] | None]:
        """See :func:`quickzones.store.kv.read_after_commit`."""
        self._check_open()
        self._read_after.extend(keys)
        wanted = list(keys)

        def values() -> list[bytes | None] | None:
            found = self._read_after_values
            if found is None or self._state is not _COMMITTED:
                return None
            return [found.get(key) for key in wanted]

        return values

    def on_commit(self, callback: Callable[[], None]) -> None:
        self._check_open()
        self._on_commit.append(callback)

    def _run_on_commit(self) -> None:
        callbacks, self._on_commit = self._on_commit, []
        for callback in callbacks:
            callback()

    def on_error(self, error: KVError) -> None:
        if not isinstance(error, KVError) or not error.retryable:
            raise error
        if self._retry_at_once:
            # Not contention but stale kept values (once a transaction: its later tries
            # read afresh): no backoff, and no retry counted against the caller's limit.
            self._retry_at_once = False
            self._release()
            self._reset_state()
            return
        if 0 <= self._retry_limit <= self._retries:
            raise error
        self._retries += 1
        if error.code in (TRANSACTION_TOO_OLD, FUTURE_VERSION):
            delay = FIXED_BACKOFF_S
        else:
            delay = self._random() * min(self._backoff_s, self._max_retry_delay_s)
            self._backoff_s = min(self._backoff_s * 2, self._max_retry_delay_s)
        self._release()
        self._clock.sleep(delay)
        self._reset_state()

    def reset(self) -> None:
        self._release()
        self._reset_options()
        self._reset_state()

    def cancel(self) -> None:
        """Abandon the transaction; every later call raises 1025 until reset()."""
        self._release()
        self._on_commit = []
        self._state = _CANCELLED

    def set_timeout(self, millis: int) -> None:
        if millis < 0:
            raise InvalidArgument("timeout", millis, "must be >= 0 (0 disables it)")
        self._timeout_s = millis / 1000.0

    def set_retry_limit(self, limit: int) -> None:
        self._retry_limit = limit

    def set_max_retry_delay(self, millis: int) -> None:
        self._max_retry_delay_s = max(0.0, millis / 1000.0)

    def set_causal_read_risky(self) -> None:
        """Accepted as a hint; these backends always hand out the newest read version."""

    @property
    def retries(self) -> int:
        """How many times on_error has retried this transaction since creation/reset."""
        return self._retries

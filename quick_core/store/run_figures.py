"""Per job type figures kept with the data (issue 45 point 4): how long runs take (a
histogram per ten-minute window) and how many runs failed (a counter per minute), both
atomic adds in the transaction that ends the run, so each run is counted once, exactly
when its outcome commits::

    (root, "m", "runtime", app, job_type, window, bucket) -> i64 (atomic add)
    (root, "m", "errors", app, minute, job_type)          -> i64 (atomic add)

A window is ten minutes (:data:`WINDOW_MS`); the buckets are the pickup histogram's
(:data:`quickzones.store.pickups.BOUNDS_MS`). The usual run time of a type (its p99) is
read from the last hour's windows: at most 7 x 14 keys a type. Errors are read per minute
for an hour: 61 x (job types that failed) keys an app.

Bounded: a writer clears the windows and minutes older than the hour kept, with a blind
range clear, the first time it writes a new window or minute (remembered per store,
:class:`Retention`), so each app keeps about an hour (job types x 7 x 14 and
61 x job types counters) however long it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64
from quickzones.store.pickups import Histogram, bucket_of

WINDOW_MS = 10 * 60_000
KEEP_WINDOWS = 7  # the hour, and the window under way
KEEP_MINUTES = 61
_RUNTIME = "runtime"
_ERRORS = "errors"
# (app, job_type) pairs a store remembers having cleared for: past this it forgets them
# all and clears again (a clear more, never a counter kept longer).
_REMEMBERED = 10_000


class Retention:
    """Which (app, job type) windows and app minutes this store has already cleared the
    old ones for, so a writer clears once a window, not at every run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, str], int] = {}

    def first(self, kind: str, app: str, job_type: str, period: int) -> bool:
        """True the first time (kind, app, job_type) is written in ``period``."""
        key = (kind, app, job_type)
        with self._lock:
            if self._seen.get(key) == period:
                return False
            if len(self._seen) >= _REMEMBERED:
                self._seen.clear()
            self._seen[key] = period
            return True


def window_of(at_ms: int) -> int:
    return at_ms // WINDOW_MS


def minute_of(at_ms: int) -> int:
    return at_ms // 60_000


def add_run(
    tr: KVTransaction,
    keys: KeySpace,
    retention: Retention,
    app: str,
    job_type: str,
    ran_ms: int,
    now_ms: int,
) -> None:
    """Count one run of ``ran_ms`` in its type's histogram, in ``tr`` (an atomic add)."""
    window = window_of(now_ms)
    tr.add(keys.meta_key(_RUNTIME, app, job_type, window, bucket_of(ran_ms)), pack_i64(1))
    if retention.first(_RUNTIME, app, job_type, window):
        tr.clear_range(
            keys.meta_key(_RUNTIME, app, job_type, 0),
            keys.meta_key(_RUNTIME, app, job_type, window - KEEP_WINDOWS + 1),
        )


def add_error(
    tr: KVTransaction,
    keys: KeySpace,
    retention: Retention,
    app: str,
    job_type: str,
    now_ms: int,
) -> None:
    """Count one failed run of ``job_type`` in the current minute, in ``tr``."""
    minute = minute_of(now_ms)
    tr.add(keys.meta_key(_ERRORS, app, minute, job_type), pack_i64(1))
    if retention.first(_ERRORS, app, "", minute):
        tr.clear_range(
            keys.meta_key(_ERRORS, app, 0), keys.meta_key(_ERRORS, app, minute - KEEP_MINUTES + 1)
        )


def _read(kv: KVStore, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(begin, end, snapshot=True)

    return run(kv, read)


def runtimes(
    kv: KVStore, keys: KeySpace, app: str, job_types: Iterable[str], now_ms: int
) -> dict[str, Histogram]:
    """Each of ``job_types``' run-time histogram over the last hour (a type without runs
    in it has an empty one). One bounded read a type."""
    window = window_of(now_ms)
    out: dict[str, Histogram] = {}
    for job_type in sorted(set(job_types)):
        histogram = out.setdefault(job_type, Histogram())
        begin = keys.meta_key(_RUNTIME, app, job_type, window - KEEP_WINDOWS + 1)
        for key, value in _read(kv, begin, keys.meta_key(_RUNTIME, app, job_type, window + 1)):
            bucket = keys.unpack(key)[-1]
            if isinstance(bucket, int):
                histogram.add(bucket, unpack_i64(value))
    return out


@dataclass(frozen=True, slots=True)
class ErrorMinute:
    """Failed runs in one minute (minutes since the epoch), per job type."""

    minute: int
    by_type: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_type.values())


def error_history(
    kv: KVStore, keys: KeySpace, app: str, now_ms: int, minutes: int = 60
) -> list[ErrorMinute]:
    """Failed runs per job type for each of the last ``minutes`` minutes, oldest first:
    one range read of the app's counters."""
    last = minute_of(now_ms)
    first = last - minutes + 1
    by_minute: dict[int, dict[str, int]] = {m: {} for m in range(first, last + 1)}
    rows = _read(kv, keys.meta_key(_ERRORS, app, first), keys.meta_key(_ERRORS, app, last + 1))
    for key, value in rows:
        *_, minute, job_type = keys.unpack(key)
        if isinstance(minute, int) and minute in by_minute:
            by_minute[minute][str(job_type)] = unpack_i64(value)
    return [ErrorMinute(m, by_type) for m, by_type in sorted(by_minute.items())]

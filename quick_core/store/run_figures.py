"""Per job type figures of the runs that ended (issue 45 point 4): how long runs took (a
histogram per ten-minute window) and how many runs failed (a counter per minute)::

    (root, "m", "runtime", app, job_type, window, bucket) -> i64 (atomic add)
    (root, "m", "errors", app, minute, job_type)          -> i64 (atomic add)

Counted as pickups are: a consumer counts its runs in memory (a worker's ``ran`` event;
``quick serve`` its pull leases' outcomes) and adds them every few seconds in the pickup
summary's flush transaction (:func:`quickzones.store.pickups.add_counts`, which calls
:func:`add_in`), so a run costs a dictionary increment, never a write of its own, and no
key is added to by every run of a type. A window is ten minutes (:data:`WINDOW_MS`); the
buckets are the pickup histogram's (``pickups.BOUNDS_MS``). The usual run time of a type
(its p99) is read from the last hour's windows: at most 7 x 14 keys a type. Failures are
read per minute for an hour: 61 x (job types that failed) keys an app.

Bounded: each flush clears, with blind range clears, the windows and minutes older than
the hour kept of the (app, job type) pairs and apps it adds to, so each app keeps about an
hour (job types x 7 x 14 and 61 x job types counters) however long it runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64

WINDOW_MS = 10 * 60_000
KEEP_WINDOWS = 7  # the hour, and the window under way
KEEP_MINUTES = 61
_RUNTIME = "runtime"
_ERRORS = "errors"

# (app, job_type, window, bucket) -> runs, and (app, minute, job_type) -> failed runs, as
# a consumer gathers them between flushes.
RunCounts = Mapping[tuple[str, str, int, int], int]
FailureCounts = Mapping[tuple[str, int, str], int]


def window_of(at_ms: int) -> int:
    return at_ms // WINDOW_MS


def minute_of(at_ms: int) -> int:
    return at_ms // 60_000


def add_in(
    tr: KVTransaction, keys: KeySpace, runs: RunCounts, failures: FailureCounts, now_ms: int
) -> None:
    """Add gathered run and failure counts in ``tr`` (atomic adds), and clear the windows
    and minutes past the hour kept of what they add to (blind range clears)."""
    for (app, job_type, window, bucket), n in runs.items():
        tr.add(keys.meta_key(_RUNTIME, app, job_type, window, bucket), pack_i64(n))
    for (app, minute, job_type), n in failures.items():
        tr.add(keys.meta_key(_ERRORS, app, minute, job_type), pack_i64(n))
    first_window = window_of(now_ms) - KEEP_WINDOWS + 1
    for app, job_type in {(app, job_type) for app, job_type, _, _ in runs}:
        tr.clear_range(
            keys.meta_key(_RUNTIME, app, job_type, 0),
            keys.meta_key(_RUNTIME, app, job_type, first_window),
        )
    first_minute = minute_of(now_ms) - KEEP_MINUTES + 1
    for app in {app for app, _, _ in failures}:
        tr.clear_range(keys.meta_key(_ERRORS, app, 0), keys.meta_key(_ERRORS, app, first_minute))


def _read(kv: KVStore, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(begin, end, snapshot=True)

    return run(kv, read)


def runtimes(
    kv: KVStore, keys: KeySpace, app: str, job_types: Iterable[str], now_ms: int
) -> dict[str, Counter[int]]:
    """Each of ``job_types``' runs per histogram bucket over the last hour (a type
    without runs in it has none). One bounded read a type."""
    window = window_of(now_ms)
    out: dict[str, Counter[int]] = {}
    for job_type in sorted(set(job_types)):
        counts = out.setdefault(job_type, Counter())
        begin = keys.meta_key(_RUNTIME, app, job_type, window - KEEP_WINDOWS + 1)
        for key, value in _read(kv, begin, keys.meta_key(_RUNTIME, app, job_type, window + 1)):
            bucket = keys.unpack(key)[-1]
            if isinstance(bucket, int):
                counts[bucket] += unpack_i64(value)
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

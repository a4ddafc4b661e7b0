"""Per-tenant pickup summaries (issue 31 point 6): how long items waited from enqueue to
dequeue, per minute, kept in the store so a dashboard in another process (``quick
serve``) can show each tenant's pickup latency and the app's throughput history.

A summary is a histogram: one counter per (app, minute, tenant, bucket) and one per
(app, minute, bucket) for the whole app, under::

    (root, "m", "pickup", app, minute, tenant, bucket) -> i64 (atomic add)
    (root, "m", "pickup-app", app, minute, bucket)     -> i64 (atomic add)

A consumer counts its dequeues in memory and adds its counts every few seconds, in
transactions of atomic adds and range clears (at most :data:`FLUSH_BATCH` counters each):
they conflict with nothing, and an item costs a dictionary increment, never a write of its
own. The same flush clears the app's minutes older than :data:`KEEP_MINUTES`, so the size
stays bounded (tenants x buckets x an hour) whatever the traffic; an app nothing is picked
up from any more keeps its last hour.

Atomic adds are not idempotent, and a commit whose answer is lost
(``commit_unknown_result``) is tried again. So each flush transaction carries an id, and
writes a marker with its adds (issue 41 point 14d)::

    (root, "m", "pickup-done", minute, flush_id) -> b""

A try that finds its marker committed before and adds nothing; a flush that failed is
tried again later with the same id and counts. Markers are cleared with the minutes.

The same flush, marker and retention carry the run figures a consumer counts the same
way: run times and failed runs per job type (:mod:`quickzones.store.run_figures`, issue
45 point 4).

So the fairness view finds an app's busiest tenants without reading every tenant's
counters (issue 43 point 3), each minute also keeps its tenants ordered by pickups::

    (root, "m", "pickup-top", app, minute, -count, tenant) -> b""

A flush reads each of its tenants' counts of the minute (snapshot reads: it conflicts
with nothing still), moves the tenant's entry to the new count, and the first entries of
a minute are its busiest tenants. Two consumers flushing the same tenant at once may
each leave an entry; the reader keeps a tenant's largest, and the exact counts of the
tenants shown come from their counters.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quickzones.store import run_figures
from quickzones.store.keys import KeySpace, tuple_range
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64

# Upper bounds of the histogram's buckets, in ms; the last bucket holds everything slower.
BOUNDS_MS = (10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000)
OVER = BOUNDS_MS[-1] + 1  # a percentile in the last bucket: slower than every bound
KEEP_MINUTES = 61  # an hour of history, and the minute under way
_TENANT = "pickup"
_APP = "pickup-app"
_DONE = "pickup-done"
_TOP = "pickup-top"
BUSIEST_MAX = 1_000  # ranks the busiest tenants are paged through, at most
# Counters one flush transaction adds at most: a consumer's counts kept through a long
# outage (up to 100,000 of them, long tenant names) once outgrew a transaction's 10 MB,
# and no flush could commit again. 1,000 of the longest names take about 0.7 MB.
FLUSH_BATCH = 1_000

# (app, tenant, minute, bucket) -> count, as a consumer gathers them between flushes.
Counts = Mapping[tuple[str, str, int, int], int]


def bucket_of(wait_ms: int) -> int:
    """The index of the bucket a wait of ``wait_ms`` falls in."""
    return bisect.bisect_left(BOUNDS_MS, max(0, wait_ms))


def minute_of(at_ms: int) -> int:
    return at_ms // 60_000


@dataclass(slots=True)
class Histogram:
    """Counts per bucket; percentiles are a bucket's upper bound (:data:`OVER`: slower
    than the last bound; None: no pickups)."""

    counts: Counter[int] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, bucket: int, n: int) -> None:
        self.counts[bucket] += n

    def percentile(self, fraction: float) -> int | None:
        total = self.total
        if total == 0:
            return None
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= fraction * total:
                return BOUNDS_MS[bucket] if bucket < len(BOUNDS_MS) else OVER
        return OVER


def add_counts(
    kv: KVStore,
    keys: KeySpace,
    counts: Counts,
    now_ms: int,
    flush_id: str | None = None,
    *,
    runs: run_figures.RunCounts | None = None,
    failures: run_figures.FailureCounts | None = None,
) -> bool:
    """Add a consumer's gathered counts and clear its apps' minutes past the hour kept:
    atomic adds, blind clears and a snapshot read of each (tenant, minute)'s count for
    the busiest-tenants index, one transaction (keep the counters, ``runs`` and
    ``failures`` too, to :data:`FLUSH_BATCH`). ``runs`` and ``failures``: the run times
    and failed runs per job type it counted (:mod:`quickzones.store.run_figures`), added
    in the same transaction. With ``flush_id`` (unique to these counts, and given again
    with the same counts and ``now_ms`` when they are tried again) it adds them once,
    whatever earlier tries did: False when one had committed them already."""
    runs = runs or {}
    failures = failures or {}
    if not (counts or runs or failures):
        return False
    per_app: Counter[tuple[str, int, int]] = Counter()
    per_tenant: Counter[tuple[str, int, str]] = Counter()
    for (app, tenant, minute, bucket), n in counts.items():
        per_app[(app, minute, bucket)] += n
        per_tenant[(app, minute, tenant)] += n
    cutoff = minute_of(now_ms) - KEEP_MINUTES
    marker = None if flush_id is None else keys.meta_key(_DONE, minute_of(now_ms), flush_id)

    # Each (app, minute)'s key prefixes packed once, and each tenant's name once: a flush
    # writes a few keys for each of up to FLUSH_BATCH tenants.
    heads = {
        (app, minute): (keys.meta_key(_TENANT, app, minute), keys.meta_key(_TOP, app, minute))
        for app, minute, _ in per_tenant
    }
    named = {tenant: keys.extend(b"", tenant) for _, _, tenant in per_tenant}

    def write(tr: KVTransaction) -> bool:
        if marker is not None:
            if tr.get(marker) is not None:
                return False  # an earlier try committed (its answer was lost)
            tr.set(marker, b"")
            tr.clear_range(keys.meta_key(_DONE, 0), keys.meta_key(_DONE, cutoff))
        for (app, minute, tenant), n in per_tenant.items():  # read before this adds
            counters, top = heads[(app, minute)]
            name = named[tenant]
            before = _count(tr, counters + name)
            if before:
                tr.clear(keys.extend(top, -before) + name)
            tr.set(keys.extend(top, -(before + n)) + name, b"")
        for (app, tenant, minute, bucket), n in counts.items():
            tr.add(keys.extend(heads[(app, minute)][0] + named[tenant], bucket), pack_i64(n))
        for (app, minute, bucket), n in per_app.items():
            tr.add(keys.meta_key(_APP, app, minute, bucket), pack_i64(n))
        for app in {app for app, _, _ in per_app}:
            tr.clear_range(keys.meta_key(_TENANT, app, 0), keys.meta_key(_TENANT, app, cutoff))
            tr.clear_range(keys.meta_key(_APP, app, 0), keys.meta_key(_APP, app, cutoff))
            tr.clear_range(keys.meta_key(_TOP, app, 0), keys.meta_key(_TOP, app, cutoff))
        run_figures.add_in(tr, keys, runs, failures, now_ms)
        return True

    return run(kv, write)


def _count(tr: KVTransaction, prefix: bytes) -> int:
    """A tenant's pickups in one minute as committed (adds of this transaction are not
    seen: the caller reads before it adds), by a snapshot read of its buckets (at most 14
    keys) under ``prefix``, its (app, minute, tenant) counters' packed prefix."""
    begin, end = tuple_range(prefix)
    return sum(unpack_i64(v) for _, v in tr.get_range(begin, end, snapshot=True))


def _rows(
    kv: KVStore, begin: bytes, end: bytes, limit: int = 10_000
) -> Iterable[tuple[bytes, bytes]]:
    cursor = begin
    while True:

        def page(tr: KVTransaction, start: bytes = cursor) -> list[tuple[bytes, bytes]]:
            return tr.get_range(start, end, limit=limit, snapshot=True)

        rows = run(kv, page)
        yield from rows
        if len(rows) < limit:
            return
        cursor = rows[-1][0] + b"\x00"


def tenant_pickups(
    kv: KVStore, keys: KeySpace, app: str, now_ms: int, minutes: int = 5
) -> dict[str, Histogram]:
    """Each tenant's pickup histogram over the last ``minutes`` (the current one too)."""
    last = minute_of(now_ms)
    out: dict[str, Histogram] = {}
    begin = keys.meta_key(_TENANT, app, last - minutes + 1)
    for key, value in _rows(kv, begin, keys.meta_key(_TENANT, app, last + 1)):
        *_, tenant, bucket = keys.unpack(key)
        if isinstance(bucket, int):  # (a key of another shape is not this module's)
            out.setdefault(str(tenant), Histogram()).add(bucket, unpack_i64(value))
    return out


def tenant_histogram(
    tr: KVTransaction, keys: KeySpace, app: str, tenant: str, now_ms: int, minutes: int = 5
) -> Histogram:
    """One tenant's pickup histogram over the last ``minutes``, read in ``tr`` (snapshot):
    a range read of at most one key per bucket for each minute, whatever the app's other
    tenants."""
    out = Histogram()
    last = minute_of(now_ms)
    for minute in range(last - minutes + 1, last + 1):
        begin, end = keys.meta_range(_TENANT, app, minute, tenant)
        for key, value in tr.get_range(begin, end, snapshot=True):
            bucket = keys.unpack(key)[-1]
            if isinstance(bucket, int):
                out.add(bucket, unpack_i64(value))
    return out


def busiest(
    kv: KVStore, keys: KeySpace, app: str, now_ms: int, minutes: int = 5, *, first: int
) -> list[tuple[str, int]]:
    """The app's ``first`` busiest tenants over the last ``minutes`` (at most
    :data:`BUSIEST_MAX`), most pickups first, with their pickups as ranked: the sum of
    their counts in each minute's first ``first`` entries. It reads ``first`` entries a
    minute, so a tenant just outside every minute's top may be ranked below its due:
    the ranking is of tenants busy in some minute, which is what a noisy one is."""
    first = min(first, BUSIEST_MAX)
    last = minute_of(now_ms)

    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        rows: list[tuple[bytes, bytes]] = []
        for minute in range(last - minutes + 1, last + 1):
            begin, end = keys.meta_range(_TOP, app, minute)
            rows += tr.get_range(begin, end, limit=first, snapshot=True)
        return rows

    best: dict[tuple[int, str], int] = {}
    for key, _ in run(kv, read):
        *_, minute, negative, tenant = keys.unpack(key)
        if isinstance(minute, int) and isinstance(negative, int):
            slot = (minute, str(tenant))
            best[slot] = max(best.get(slot, 0), -negative)
    totals: Counter[str] = Counter()
    for (_, tenant), n in best.items():
        totals[tenant] += n
    ranked = sorted(totals.items(), key=lambda kv_: (-kv_[1], kv_[0]))
    return ranked[:first]


def app_total(kv: KVStore, keys: KeySpace, app: str, now_ms: int, minutes: int = 5) -> int:
    """The app's pickups over the last ``minutes`` (its per-minute counters)."""
    return sum(h.total for _, h in app_history(kv, keys, app, now_ms, minutes))


def app_history(
    kv: KVStore, keys: KeySpace, app: str, now_ms: int, minutes: int = 60
) -> list[tuple[int, Histogram]]:
    """The app's histogram for each of the last ``minutes`` minutes, oldest first (minute
    numbers since the epoch; a minute without pickups has an empty histogram)."""
    last = minute_of(now_ms)
    first = last - minutes + 1
    by_minute = {m: Histogram() for m in range(first, last + 1)}
    rows = _rows(kv, keys.meta_key(_APP, app, first), keys.meta_key(_APP, app, last + 1))
    for key, value in rows:
        *_, minute, bucket = keys.unpack(key)
        if isinstance(minute, int) and isinstance(bucket, int) and minute in by_minute:
            by_minute[minute].add(bucket, unpack_i64(value))
    return sorted(by_minute.items())


def percentile_label(ms: int | None) -> str:
    """A percentile as shown: the bucket's bound ("≤ 250 ms"), or "-" without pickups."""
    if ms is None:
        return "-"
    if ms == OVER:
        return f"> {BOUNDS_MS[-1] // 1000} s"
    return f"≤ {ms} ms" if ms < 1000 else f"≤ {ms / 1000:g} s"

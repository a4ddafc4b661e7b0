"""Per-app rate limits and pool-wide concurrency caps, kept in the store itself so every
consumer and producer of a deployment sees the same numbers.

Rate limits count in fixed windows with atomic adds and snapshot reads: no transaction ever
conflicts on a hot counter, at the price of a small overshoot when many producers race on
the same window (each reads the count, then adds). Concurrency caps are exact: each
consumer keeps a slot record per scope with an expiry it refreshes, so a crashed consumer's
slots lapse; acquiring reads the scope's slots with a conflict, so two racing acquirers
cannot both take the last slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock, now_ms
from quickzones.errors import InvalidArgument, QuickError
from quickzones.store import sharded_counts
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64
from quickzones.store.meta_sets import CACHE_MAX, Lru

# How late a visit for a tenant's start slot may come and still leave the next slot where
# the schedule has it (Limits.grant_starts); later is an idle spell, not lateness.
LATE_CARRY_MS = 1_000


class RateLimited(QuickError):
    """An app exceeded its enqueue rate; retry after ``retry_after_s``."""

    def __init__(self, app: str, limit: int, retry_after_s: float) -> None:
        super().__init__(
            f"app {app!r} exceeded its limit of {limit} enqueues per minute; "
            f"retry in {retry_after_s:.1f}s"
        )
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class AppLimits:
    """Limits of one app; None means unlimited."""

    enqueues_per_minute: int | None = None
    dispatches_per_second: int | None = None
    max_concurrency: int | None = None  # items of this app running across the whole pool

    @property
    def limits_dispatch(self) -> bool:
        """Whether a Manager must cut its visits for this app (rate or concurrency)."""
        return self.dispatches_per_second is not None or self.max_concurrency is not None

    def encode(self) -> bytes:
        packed: bytes = msgpack.packb(
            {
                "v": 1,
                "e": self.enqueues_per_minute,
                "d": self.dispatches_per_second,
                "c": self.max_concurrency,
            }
        )
        return packed

    @staticmethod
    def decode(raw: bytes) -> AppLimits:
        obj = msgpack.unpackb(raw)
        return AppLimits(obj.get("e"), obj.get("d"), obj.get("c"))


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidArgument(name, value, "must be a positive integer or None")


# A concurrency cap's name: an app or a job type, or (per-tenant caps,
# quickzones.store.tenant_limits) the (app, tenant) or (app, tenant, job type) it caps.
SlotName = str | tuple[str, ...]


def _name(name: SlotName) -> tuple[str | None, ...]:
    """A slot name's key elements, ended by None: the slots of ("a", "t") and those of
    ("a", "t", "report") lie in disjoint ranges, so a tenant's job-type slots never count
    against the tenant-wide cap (they once did: one running item counted twice)."""
    return (*((name,) if isinstance(name, str) else name), None)


class Limits:
    """Reads and enforces limits over the KV store."""

    def __init__(self, kv: KVStore, keys: KeySpace, clock: Clock) -> None:
        self.kv = kv
        self.keys = keys
        self.clock = clock
        # Per app, bounded: a consumer of many apps keeps the recently visited ones.
        self._cache: Lru[str, tuple[float, AppLimits]] = Lru(CACHE_MAX)

    # --- configuration -----------------------------------------------------------------

    def set(self, app: str, limits: AppLimits) -> None:
        _check_limit("enqueues_per_minute", limits.enqueues_per_minute)
        _check_limit("dispatches_per_second", limits.dispatches_per_second)
        _check_limit("max_concurrency", limits.max_concurrency)
        run(self.kv, lambda tr: tr.set(self.keys.meta_key("limits", app), limits.encode()))
        self._cache.pop(app)

    def get(self, app: str, tr: KVTransaction | None = None) -> AppLimits:
        """An app's limits, cached for a second so the hot path rarely reads them."""
        cached = self._cache.get(app)
        now = self.clock.now()
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]

        def read(t: KVTransaction) -> AppLimits:
            raw = t.get(self.keys.meta_key("limits", app), snapshot=True)
            return AppLimits() if raw is None else AppLimits.decode(raw)

        limits = run(tr if tr is not None else self.kv, read)
        self._cache.put(app, (now, limits))
        return limits

    # --- rate limits -------------------------------------------------------------------

    def charge_enqueue(self, tr: KVTransaction, app: str, n: int = 1) -> None:
        """Count ``n`` enqueues in the caller's transaction, or raise RateLimited."""
        limit = self.get(app, tr).enqueues_per_minute
        if limit is None:
            return
        now = now_ms(self.clock)
        window = now // 60_000
        key = self.keys.meta_key("rate", "enqueue", app, window)
        used = sharded_counts.read(tr, key)
        if used + n > limit:
            raise RateLimited(app, limit, ((window + 1) * 60_000 - now) / 1000)
        sharded_counts.add(tr, key, n)

    def grant_dispatch(self, app: str, wanted: int) -> tuple[int, int]:
        """How many of ``wanted`` items the app may start now, and when its next window
        opens (ms). Charges what it grants."""
        limit = self.get(app).dispatches_per_second
        now = now_ms(self.clock)
        window = now // 1000
        if limit is None:
            return wanted, now
        key = self.keys.meta_key("rate", "dispatch", app, window)

        def grant(tr: KVTransaction) -> int:
            used = unpack_i64(tr.get(key, snapshot=True))
            granted = free_of(limit, used, wanted)
            if granted:
                tr.add(key, pack_i64(granted))
            return granted

        return run(self.kv, grant), (window + 1) * 1000

    def dispatches_used(self, app: str) -> tuple[int, int]:
        """How many of ``app``'s dispatches this second's window has counted, and when
        the next window opens (ms): what :meth:`grant_dispatch` reads, nothing charged
        (``quick explain``)."""
        window = now_ms(self.clock) // 1000
        key = self.keys.meta_key("rate", "dispatch", app, window)
        raw = run(self.kv, lambda tr: tr.get(key, snapshot=True))
        return unpack_i64(raw), (window + 1) * 1000

    def grant_starts(
        self, name: tuple[str, ...], wanted: int, rate: int, per_ms: int
    ) -> tuple[int, int]:
        """How many of ``wanted`` items ``name`` (a tenant, or a tenant's job type) may
        start now under ``rate`` starts per ``per_ms``, and when the next may (store
        ms). Exact across consumers: the generic cell rate algorithm over one stored
        time (the slot the last start filled), read with a conflict, so two consumers
        granting at once serialise.

        Starts are slots ``per_ms / rate`` apart, each counted from the slot before, not
        from when a visit came for it: a visit late by up to one interval (at most
        :data:`LATE_CARRY_MS`) starts its item and leaves the next slot where it was,
        so a busy tenant gets its whole rate (issue 41 point 11: spacing from the late
        visit lost each visit's lateness, and 10/s gave 8.6-9.0/s). A schedule further
        behind is an idle tenant's: it restarts now with a burst of a tenth of
        ``rate`` (at least one). In any window of T ms at most
        ``ceil(rate x T / per_ms) + burst`` start."""
        key = self.keys.meta_key("rate", "starts", *name)

        def grant(tr: KVTransaction) -> tuple[int, int]:
            raw = tr.get(key)
            stored = None if raw is None else float(msgpack.unpackb(raw))
            granted, t, next_ms = start_slots(stored, now_ms(self.clock), wanted, rate, per_ms)
            if granted:
                tr.set(key, msgpack.packb(t))
            return granted, next_ms

        return run(self.kv, grant)

    def next_start_ms(self, name: tuple[str, ...], rate: int, per_ms: int) -> int | None:
        """When :meth:`grant_starts` would next grant ``name`` a start (store ms), None
        when it would now: the same schedule, read with a snapshot, nothing granted
        (``quick explain``)."""
        key = self.keys.meta_key("rate", "starts", *name)
        raw = run(self.kv, lambda tr: tr.get(key, snapshot=True))
        stored = None if raw is None else float(msgpack.unpackb(raw))
        granted, _, next_ms = start_slots(stored, now_ms(self.clock), 1, rate, per_ms)
        return None if granted else next_ms

    def refund_starts(self, name: tuple[str, ...], n: int, rate: int, per_ms: int) -> None:
        """Give back ``n`` starts :meth:`grant_starts` granted and no item used."""
        key = self.keys.meta_key("rate", "starts", *name)

        def refund(tr: KVTransaction) -> None:
            raw = tr.get(key)
            if raw is not None:
                tr.set(key, msgpack.packb(float(msgpack.unpackb(raw)) - n * per_ms / rate))

        run(self.kv, refund)

    # --- pool-wide concurrency caps ----------------------------------------------------

    def acquire_slots(
        self,
        scope: str,
        name: SlotName,
        holder: str,
        wanted: int,
        cap: int,
        ttl_ms: int,
        *,
        whole: bool = False,
    ) -> int:
        """Take up to ``wanted`` of ``cap`` slots of (scope, name) for ``holder``; returns
        how many (with ``whole``, all of them or none: a run that costs several slots).
        Reads every holder's slot record with a conflict, so concurrent acquirers
        serialise and the cap holds exactly."""
        begin, end = self.keys.meta_range("slots", scope, *_name(name))
        mine = self.keys.meta_key("slots", scope, *_name(name), holder)

        def take(tr: KVTransaction) -> int:
            now = now_ms(self.clock)
            held = _holders(tr.get_range(begin, end), now)
            own = held.pop(mine, 0)
            granted = free_of(cap, sum(held.values()) + own, wanted)
            if whole and granted < wanted:
                granted = 0
            if granted:
                tr.set(mine, msgpack.packb((own + granted, now + ttl_ms)))
            return granted

        return run(self.kv, take)

    def slots_held(self, scope: str, name: SlotName) -> dict[str, int]:
        """Each holder's live slots of (scope, name), as :meth:`acquire_slots` counts
        them: a snapshot read, nothing taken (``quick explain``). One record a consumer
        holding some, not one a tenant."""
        begin, end = self.keys.meta_range("slots", scope, *_name(name))
        rows = run(self.kv, lambda tr: tr.get_range(begin, end, snapshot=True))
        return {
            str(self.keys.unpack(k)[-1]): n for k, n in _holders(rows, now_ms(self.clock)).items()
        }

    def holdings_page(
        self, scope: str, prefix: tuple[str, ...], *, limit: int, cursor: str | None = None
    ) -> tuple[list[Holding], str | None]:
        """The live slot records of (scope, names under ``prefix``) in key order: at most
        ``limit`` records read from ``cursor`` (the last page's), and the next page's
        cursor (None: no more). A snapshot read of one page, whatever the number of
        tenants holding some (the dashboard's limits page)."""
        begin, end = self.keys.meta_range("slots", scope, *prefix)
        start = begin
        if cursor:
            try:
                last = bytes.fromhex(cursor)
            except ValueError:
                raise InvalidArgument("cursor", cursor, "not a cursor this page gave") from None
            if not begin <= last < end:
                raise InvalidArgument("cursor", cursor, "not a cursor this page gave")
            start = last + b"\x00"
        rows = run(self.kv, lambda tr: tr.get_range(start, end, limit=limit + 1, snapshot=True))
        more = len(rows) > limit
        rows = rows[:limit]
        now = now_ms(self.clock)
        found = []
        for key, raw in rows:
            count, expires = msgpack.unpackb(raw)
            if expires <= now or count <= 0:
                continue  # lapsed: held by no one
            parts = self.keys.unpack(key)
            name = parts[3:-2]  # ("m", "slots", scope, *name, None, holder)
            found.append(Holding(tuple(str(x) for x in name), str(parts[-1]), int(count)))
        return found, rows[-1][0].hex() if more else None

    def release_slots(self, scope: str, name: SlotName, holder: str, n: int, ttl_ms: int) -> None:
        mine = self.keys.meta_key("slots", scope, *_name(name), holder)

        def give(tr: KVTransaction) -> None:
            raw = tr.get(mine)
            if raw is None:
                return
            count, _ = msgpack.unpackb(raw)
            left = max(0, count - n)
            if left:
                tr.set(mine, msgpack.packb((left, now_ms(self.clock) + ttl_ms)))
            else:
                tr.clear(mine)

        run(self.kv, give)

    def refresh_slots(
        self, scope: str, name: SlotName, holder: str, count: int, ttl_ms: int
    ) -> None:
        """Keep a holder's slots alive (called by the lease extender)."""
        mine = self.keys.meta_key("slots", scope, *_name(name), holder)

        def refresh(tr: KVTransaction) -> None:
            if count > 0:
                tr.set(mine, msgpack.packb((count, now_ms(self.clock) + ttl_ms)))
            else:
                tr.clear(mine)

        run(self.kv, refresh)


@dataclass(frozen=True, slots=True)
class Holding:
    """One holder's live slots of one slot name."""

    name: tuple[str, ...]
    holder: str
    count: int


def free_of(cap: int, used: int, wanted: int) -> int:
    """How many of ``wanted`` a cap (slots, or a window's dispatches) of which ``used``
    are taken grants."""
    return max(0, min(wanted, cap - used))


def _holders(rows: list[tuple[bytes, bytes]], now: int) -> dict[bytes, int]:
    """Each slot record's live count (an expired one holds none), by its key."""
    held: dict[bytes, int] = {}
    for key, raw in rows:
        count, expires = msgpack.unpackb(raw)
        if expires > now and count > 0:
            held[key] = int(count)
    return held


def start_slots(
    stored: float | None, now: int, wanted: int, rate: int, per_ms: int
) -> tuple[int, float, int]:
    """A start rate's schedule (:meth:`Limits.grant_starts`): given the slot the last
    start filled (``stored``; None: none yet), how many of ``wanted`` may start at
    ``now``, the slot the last of them fills, and when the next may start (ms)."""
    interval = per_ms / rate
    burst = max(1, math.ceil(rate / 10))
    # Lateness carried: under one interval, so an idle tenant's burst stays ``burst``.
    carry = min(interval * 0.999, LATE_CARRY_MS)
    idle = now - burst * interval  # a full burst's worth of slots, from now
    # Behind by no more than ``carry`` past a full burst: a late visit, whose slots are
    # kept; further behind: an idle spell, restarted at ``idle``.
    t = idle if stored is None or stored < idle - carry else stored
    granted = max(0, min(wanted, math.floor((now - t) / interval + 1e-9)))
    t += granted * interval
    return granted, t, math.ceil(t + interval)


def next_window_ms(now: int, window_ms: int) -> int:
    return int(math.floor(now / window_ms) + 1) * window_ms

"""Per-tenant limits (issue 31 point 2), kept in the store so every consumer of a
deployment enforces the same numbers.

A limit is one small record under ``(root, "m", "tenant_limit", app, tenant, job_type)``,
an empty job type standing for every job type of the tenant. It caps how many of the
tenant's items (or of its items of one job type) run at once across every consumer
(``max_running``: slots in :class:`~quickzones.store.limits.Limits`, as an app's
``max_concurrency``), and how many start per period (``rate`` per ``per_s``: exact, evenly
spaced, :meth:`~quickzones.store.limits.Limits.grant_starts`). A visit (Algorithm 2)
takes no more than they allow (:mod:`quickzones.consumer.tenant_admission`); what they
hold back stays vested in its zone, counts no attempt, and the zone's pointer is looked
at again when a start is allowed, not in a loop. A visit looks up its zone's limits
(:mod:`.meta_sets`), cached and checked at most once a ``refresh_s`` (1 s), as pauses are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock
from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction
from quickzones.store.meta_sets import CACHE_MAX, AppSettings
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_job_type, check_name

REFRESH_S = 1.0  # a changed limit is enforced by every consumer within about this long
MAX_RUNNING = 1_000_000
MAX_RATE = 1_000_000
MIN_PER_S, MAX_PER_S = 0.001, 86_400.0


def _check_count(name: str, value: object, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidArgument(name, value, f"must be a whole number from 1 to {most:,}, or None")
    return value


def _check_per(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument("per", value, "must be a number of seconds")
    per = float(value)
    if not math.isfinite(per) or not MIN_PER_S <= per <= MAX_PER_S:
        raise InvalidArgument("per", value, f"must be from {MIN_PER_S:g} to {MAX_PER_S:g} seconds")
    return per


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """The limits of one tenant of an app, or of one job type of it; None: no limit."""

    app: str
    tenant: str
    job_type: str | None = None
    max_running: int | None = None  # items running at once, across every consumer
    rate: int | None = None  # starts per ``per_s`` seconds
    per_s: float = 1.0

    @staticmethod
    def of(
        app: str,
        tenant: str,
        job_type: str | None = None,
        *,
        max_running: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
    ) -> TenantLimit:
        """A checked limit: at least one of ``max_running`` and ``rate``."""
        limit = TenantLimit(
            check_name("app", app),
            check_name("tenant", tenant),
            None if job_type is None else check_job_type(job_type),
            _check_count("max_running", max_running, MAX_RUNNING),
            _check_count("rate", rate, MAX_RATE),
            _check_per(per),
        )
        if limit.max_running is None and limit.rate is None:
            raise InvalidArgument("limit", None, "give max_running, rate, or both")
        return limit

    @property
    def per_ms(self) -> int:
        return max(1, round(self.per_s * 1000))

    def name(self) -> tuple[str, ...]:
        """Its slots' and rate's name in :class:`~quickzones.store.limits.Limits`."""
        base = (self.app, self.tenant)
        return base if self.job_type is None else (*base, self.job_type)

    def describe(self) -> str:
        parts = [f"app={self.app}", f"tenant={self.tenant}"]
        if self.job_type is not None:
            parts.append(f"job_type={self.job_type}")
        if self.max_running is not None:
            parts.append(f"max_running={self.max_running}")
        if self.rate is not None:
            parts.append(f"rate={self.rate}/{self.per_s:g}s")
        return " ".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {
            "app": self.app,
            "tenant": self.tenant,
            "job_type": self.job_type,
            "max_running": self.max_running,
            "rate": self.rate,
            "per_s": self.per_s,
        }


def limit_of(
    target: TenantLimit, max_running: int | None, rate: int | None, per_s: float
) -> TenantLimit:
    return TenantLimit(target.app, target.tenant, target.job_type, max_running, rate, per_s)


class TenantLimits(AppSettings[None, tuple[TenantLimit, ...], TenantLimit]):
    """Sets, clears and reads per-tenant limits over the KV store; :meth:`of_zone` is the
    cached lookup each visit takes (:mod:`.meta_sets`)."""

    kind = "tenant_limit"
    arity = 3  # (app, tenant, job type)

    def __init__(
        self,
        kv: KVStore,
        keys: KeySpace,
        clock: Clock,
        refresh_s: float = REFRESH_S,
        *,
        cache_max: int = CACHE_MAX,
    ) -> None:
        super().__init__(kv, keys, clock, refresh_s, cache_max=cache_max)

    def _key(self, app: str, tenant: str, job_type: str | None) -> bytes:
        return self.keys.meta_key("tenant_limit", app, tenant, job_type or "")

    def set(self, limit: TenantLimit) -> TenantLimit:
        """Store ``limit`` (checked by :meth:`TenantLimit.of`), replacing the one of the
        same tenant and job type."""
        packed = msgpack.packb({"v": 1, "c": limit.max_running, "r": limit.rate, "p": limit.per_s})
        key = self._key(limit.app, limit.tenant, limit.job_type)
        self._write(limit.app, limit.tenant, key, packed)
        return limit

    def clear(self, app: str, tenant: str, job_type: str | None = None) -> bool:
        """Lift the limit named exactly so; False when there was none."""
        app, tenant = check_name("app", app), check_name("tenant", tenant)
        key = self._key(app, tenant, None if job_type is None else check_job_type(job_type))
        return self._write(app, tenant, key, None)

    def _decode(self, key: bytes, raw: bytes) -> TenantLimit:
        app, tenant, job_type = self.keys.unpack(key)[-3:]
        obj = msgpack.unpackb(raw)
        limit = TenantLimit(str(app), str(tenant), str(job_type) or None)
        return limit_of(limit, obj["c"], obj["r"], float(obj["p"]))

    def _read(self, tr: KVTransaction, begin: bytes, end: bytes) -> list[TenantLimit]:
        return [self._decode(k, v) for k, v in tr.get_range(begin, end, snapshot=True)]

    def _read_app(self, tr: KVTransaction, app: str) -> None:
        return None  # limits are a tenant's: none applies to a whole app

    def _read_tenant(self, tr: KVTransaction, app: str, tenant: str) -> tuple[TenantLimit, ...]:
        return tuple(self._read(tr, *self.keys.meta_range("tenant_limit", app, tenant)))

    def _no_tenant(self) -> tuple[TenantLimit, ...]:
        return ()

    def of_zone(self, zone: ZoneId) -> tuple[TenantLimit, ...]:
        """``zone``'s tenant's limits (its own and its job types'), cached: nothing read
        for a zone of an app whose tenants have none."""
        return self.tenant_part(zone)

    def last_of(self, zone: ZoneId) -> tuple[TenantLimit, ...] | None:
        """What :meth:`of_zone` last found, however old (None: never read)."""
        found = self.last_tenant_part(zone)
        head = self._heads.get(zone.app)
        if found is None and head is not None and not head[1].tenants:
            return ()  # its app was read, and no limit named a tenant of it
        return found

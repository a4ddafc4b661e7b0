"""Tenant weights (issue 31 point 1), kept in the store so every consumer of a deployment
shares out the same way.

A weight is one small record under ``(root, "m", "weight", app, tenant)``; an empty
tenant is the app's default weight, the weight of every tenant of the app that has none
of its own (a class of tenants). A tenant without either weighs 1. Over a contended
period a tenant of weight w gets w times the share of a tenant of weight 1: a visit to its
zone takes w times the visit's size, and a scan chooses and orders its pointer by weight
(:mod:`quickzones.consumer.weighing`). Idle capacity still goes to whoever has work: a
weight only divides what is contended.

A visit looks up its zone's weight (:mod:`.meta_sets`), cached, as pauses are: no read per
visit, a change takes effect within about a second, and an app with no weight at all is
visited unweighted, whatever other apps store.
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
from quickzones.store.validation import check_name

REFRESH_S = 1.0  # a weight change is seen by every consumer within about this long
MAX_WEIGHT = 1000.0  # beyond this one tenant's visits would take a whole consumer's room
MIN_WEIGHT = 0.001


def check_weight(value: object) -> float:
    """A finite number in [MIN_WEIGHT, MAX_WEIGHT]: 0 would starve a tenant (pause it
    instead), a negative or NaN weight means nothing, a huge one is a typo."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument("weight", value, "must be a number")
    w = float(value)
    if not math.isfinite(w) or not MIN_WEIGHT <= w <= MAX_WEIGHT:
        raise InvalidArgument(
            "weight",
            value,
            f"must be a finite number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} "
            f"(to stop a tenant, pause it)",
        )
    return w


@dataclass(frozen=True, slots=True)
class TenantWeight:
    """One stored weight: a tenant's, or (tenant None) its app's default."""

    app: str
    tenant: str | None
    weight: float

    def describe(self) -> str:
        who = f"app={self.app}" + ("" if self.tenant is None else f" tenant={self.tenant}")
        return f"{who} weight={self.weight:g}"


class Weights(AppSettings[float | None, float | None, TenantWeight]):
    """Sets, clears and reads weights over the KV store; :meth:`of_zone` is the cached
    lookup consumers weigh their scans and visits by (:mod:`.meta_sets`)."""

    kind = "weight"

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

    def _key(self, app: str, tenant: str | None) -> bytes:
        return self.keys.meta_key("weight", app, "" if tenant is None else tenant)

    def set(self, app: str, tenant: str | None, weight: object) -> TenantWeight:
        """Store ``weight`` for ``tenant`` of ``app`` (None: the app's default)."""
        w = TenantWeight(
            check_name("app", app),
            None if tenant is None else check_name("tenant", tenant),
            check_weight(weight),
        )
        packed = msgpack.packb({"v": 1, "w": w.weight})
        self._write(w.app, w.tenant, self._key(w.app, w.tenant), packed)
        return w

    def clear(self, app: str, tenant: str | None) -> bool:
        """Drop the weight named exactly so (back to the app's default, or 1); False when
        there was none."""
        named = None if tenant is None else check_name("tenant", tenant)
        app = check_name("app", app)
        return self._write(app, named, self._key(app, named), None)

    def _decode(self, key: bytes, raw: bytes) -> TenantWeight:
        app, tenant = self.keys.unpack(key)[-2:]
        return TenantWeight(str(app), str(tenant) or None, float(msgpack.unpackb(raw)["w"]))

    def _get(self, tr: KVTransaction, app: str, tenant: str | None) -> float | None:
        raw = tr.get(self._key(app, tenant), snapshot=True)
        return None if raw is None else float(msgpack.unpackb(raw)["w"])

    def _read_app(self, tr: KVTransaction, app: str) -> float | None:
        return self._get(tr, app, None)  # the app's default

    def _read_tenant(self, tr: KVTransaction, app: str, tenant: str) -> float | None:
        return self._get(tr, app, tenant)

    def _no_tenant(self) -> float | None:
        return None

    def of_zone(self, zone: ZoneId) -> float | None:
        """``zone``'s weight: its tenant's own, else its app's default, else 1; None when
        its app has no weight at all (its zones are visited unweighted). One memo read
        while current (:meth:`~quickzones.store.meta_sets.AppSettings._memo`)."""
        return self._memo(zone, (), self._of_zone)

    def _of_zone(self, zone: ZoneId) -> float | None:
        default = self.app_part(zone.app)
        own = self.tenant_part(zone)
        if own is not None:
            return own
        if default is not None:
            return default
        return 1.0 if self.has_tenants(zone.app) else None

    def last_of(self, zone: ZoneId) -> float | None:
        """What :meth:`of_zone` last found, however old (None: never read, or unweighted)."""
        own = self.last_tenant_part(zone)
        return own if own is not None else self.last_app_part(zone.app)

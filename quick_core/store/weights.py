"""Tenant weights (issue 31 point 1), kept in the store so every consumer of a deployment
shares out the same way.

A weight is one small record under ``(root, "m", "weight", app, tenant)``; an empty
tenant is the app's default weight, the weight of every tenant of the app that has none
of its own (a class of tenants). A tenant without either weighs 1. Over a contended
period a tenant of weight w gets w times the share of a tenant of weight 1: a visit to its
zone takes w times the visit's size, and a scan chooses and orders its pointer by weight
(:mod:`quickzones.consumer.weighing`). Idle capacity still goes to whoever has work: a
weight only divides what is contended.

Readers keep the whole set for ``refresh_s`` (1 s), as pauses do: one snapshot range read
a second, none per visit, and a change takes effect within about a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock
from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.meta_sets import CachedRecordSet
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


@dataclass(frozen=True, slots=True)
class WeightSet:
    """The weights in force as last read."""

    tenants: dict[tuple[str, str], float]
    apps: dict[str, float]

    @staticmethod
    def of(weights: list[TenantWeight]) -> WeightSet:
        tenants = {(w.app, w.tenant): w.weight for w in weights if w.tenant is not None}
        apps = {w.app: w.weight for w in weights if w.tenant is None}
        return WeightSet(tenants, apps)

    @property
    def empty(self) -> bool:
        return not self.tenants and not self.apps

    def weight(self, zone: ZoneId) -> float:
        """The tenant's own weight, else its app's default, else 1."""
        found = self.tenants.get((zone.app, zone.tenant))
        if found is not None:
            return found
        return self.apps.get(zone.app, 1.0)


NO_WEIGHTS = WeightSet({}, {})


class Weights(CachedRecordSet[TenantWeight, WeightSet]):
    """Sets, clears and reads weights over the KV store; :meth:`current` is the cached
    read consumers weigh their scans and visits by."""

    def __init__(
        self, kv: KVStore, keys: KeySpace, clock: Clock, refresh_s: float = REFRESH_S
    ) -> None:
        super().__init__(kv, keys, clock, refresh_s)

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
        run(self.kv, lambda tr: tr.set(self._key(w.app, w.tenant), packed))
        self._cached = None  # this process sees its own change at once
        return w

    def clear(self, app: str, tenant: str | None) -> bool:
        """Drop the weight named exactly so (back to the app's default, or 1); False when
        there was none."""
        named = None if tenant is None else check_name("tenant", tenant)
        key = self._key(check_name("app", app), named)

        return self._drop(key)

    def list(self) -> list[TenantWeight]:
        """Every stored weight, read now."""
        begin, end = self.keys.meta_range("weight")

        def read(tr: KVTransaction) -> list[TenantWeight]:
            found = []
            for key, raw in tr.get_range(begin, end, snapshot=True):
                app, tenant = self.keys.unpack(key)[-2:]
                weight = float(msgpack.unpackb(raw)["w"])
                found.append(TenantWeight(str(app), str(tenant) or None, weight))
            return found

        return run(self.kv, read)

    def _set_of(self, records: Sequence[TenantWeight]) -> WeightSet:
        return WeightSet.of(list(records))

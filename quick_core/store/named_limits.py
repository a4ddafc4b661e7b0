"""Named limits (issue 45 point 2): a cap declared once per app by name and shared by the
job types that reference it (``@q.job("send", limits=["emails"], cost=1)``), kept in the
store so every consumer of a deployment enforces the same numbers.

A limit is one small record under ``(root, "m", "named_limit", app, "", name)`` (the empty
tenant field: it applies to the whole app, :mod:`.meta_sets`). It caps how many slots the
runs of its job types hold at once across every consumer (``concurrency``), how many of
them one tenant holds (``per_tenant``, enforced together with the total), and how many
slots start per period (``rate`` per ``per_s``). A run of a job type of ``cost`` n takes n
slots of each limit it names. The slots are :class:`~quickzones.store.limits.Limits`'
own (scope ``"limit"``): a named limit is a slot scope, not a second slot system.

Readers cache an app's limits and check the app's version at most once a ``refresh_s``
(1 s), so a change reaches every consumer within about a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock
from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.meta_sets import CACHE_MAX, AppSettings
from quickzones.store.tenant_limits import MAX_RATE, MAX_RUNNING, _check_count, _check_per
from quickzones.store.validation import check_name

REFRESH_S = 1.0  # a changed limit is enforced by every consumer within about this long
SCOPE = "limit"  # the slots' scope in Limits
MAX_COST = MAX_RUNNING


@dataclass(frozen=True, slots=True)
class Limit:
    """One named limit of an app; None: that part does not limit."""

    app: str
    name: str
    concurrency: int | None = None  # slots held at once, across every consumer
    per_tenant: int | None = None  # slots one tenant holds at once (with the total)
    rate: int | None = None  # slots started per ``per_s`` seconds
    per_s: float = 1.0

    @staticmethod
    def of(
        app: str,
        name: str,
        *,
        concurrency: int | None = None,
        per_tenant: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
    ) -> Limit:
        """A checked limit: at least one of ``concurrency``, ``per_tenant`` and ``rate``."""
        limit = Limit(
            check_name("app", app),
            check_limit_name(name),
            _check_count("concurrency", concurrency, MAX_RUNNING),
            _check_count("per_tenant", per_tenant, MAX_RUNNING),
            _check_count("rate", rate, MAX_RATE),
            _check_per(per),
        )
        if limit.concurrency is None and limit.per_tenant is None and limit.rate is None:
            raise InvalidArgument("limit", name, "give concurrency, per_tenant, rate, or some")
        if (
            limit.per_tenant is not None
            and limit.concurrency is not None
            and limit.per_tenant > limit.concurrency
        ):
            raise InvalidArgument(
                "per_tenant", per_tenant, f"must not exceed concurrency ({concurrency})"
            )
        return limit

    @property
    def per_ms(self) -> int:
        return max(1, round(self.per_s * 1000))

    def total_name(self) -> tuple[str, ...]:
        """The total's slot (and rate) name in :class:`~quickzones.store.limits.Limits`:
        the empty tenant, so its range holds no tenant's slot records (a tenant is never
        empty), and a count of the total reads only the total's."""
        return (self.app, self.name, "")

    def tenant_name(self, tenant: str) -> tuple[str, ...]:
        """One tenant's slot name."""
        return (self.app, self.name, tenant)

    def most(self) -> int | None:
        """The most slots one run may take and still ever start (None: no cap)."""
        caps = [c for c in (self.concurrency, self.per_tenant) if c is not None]
        return min(caps) if caps else None

    def describe(self) -> str:
        parts = [f"app={self.app}", f"limit={self.name}"]
        if self.concurrency is not None:
            parts.append(f"concurrency={self.concurrency}")
        if self.per_tenant is not None:
            parts.append(f"per_tenant={self.per_tenant}")
        if self.rate is not None:
            parts.append(f"rate={self.rate}/{self.per_s:g}s")
        return " ".join(parts)

    def as_dict(self) -> dict[str, object]:
        return {
            "app": self.app,
            "name": self.name,
            "concurrency": self.concurrency,
            "per_tenant": self.per_tenant,
            "rate": self.rate,
            "per_s": self.per_s,
        }


def check_limit_name(name: object) -> str:
    return check_name("limit name", name)


def check_cost(cost: object) -> int:
    """A job type's cost: how many slots of each of its limits one run takes."""
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
        raise InvalidArgument("cost", cost, f"must be a whole number from 1 to {MAX_COST:,}")
    return cost


class NamedLimits(AppSettings[dict[str, Limit], None, Limit]):
    """Sets, deletes and reads named limits over the KV store; :meth:`of_app` is the cached
    lookup a worker takes before each run of a limited job type (:mod:`.meta_sets`)."""

    kind = "named_limit"
    arity = 3  # (app, "", name) below (root, "m", kind)

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

    def _key(self, app: str, name: str) -> bytes:
        return self.keys.meta_key(self.kind, app, "", name)

    def set(self, limit: Limit) -> Limit:
        """Store ``limit`` (checked by :meth:`Limit.of`), replacing the one of its name."""
        packed = msgpack.packb(
            {
                "v": 1,
                "c": limit.concurrency,
                "t": limit.per_tenant,
                "r": limit.rate,
                "p": limit.per_s,
            }
        )
        self._write(limit.app, None, self._key(limit.app, limit.name), packed)
        return limit

    def delete(self, app: str, name: str) -> bool:
        """Drop the limit; False when there was none."""
        app, name = check_name("app", app), check_limit_name(name)
        return self._write(app, None, self._key(app, name), None)

    def _decode(self, key: bytes, raw: bytes) -> Limit:
        app, _, name = self.keys.unpack(key)[-3:]
        obj = msgpack.unpackb(raw)
        per = float(obj.get("p", 1.0))
        return Limit(str(app), str(name), obj.get("c"), obj.get("t"), obj.get("r"), per)

    def _read(self, tr: KVTransaction, begin: bytes, end: bytes) -> list[Limit]:
        return [self._decode(key, raw) for key, raw in tr.get_range(begin, end, snapshot=True)]

    def list(self, app: str | None = None) -> list[Limit]:
        """Every limit (of ``app``), read now (the admin's listing; workers never read it)."""
        if app is None:
            begin, end = self.keys.meta_range(self.kind)
        else:
            begin, end = self.keys.meta_range(self.kind, check_name("app", app))
        return run(self.kv, lambda tr: self._read(tr, begin, end))

    def get(self, app: str, name: str) -> Limit | None:
        """One limit, read now."""
        key = self._key(check_name("app", app), check_limit_name(name))
        found = run(self.kv, lambda tr: self._read(tr, key, key + b"\x00"))
        return found[0] if found else None

    def _read_app(self, tr: KVTransaction, app: str) -> dict[str, Limit]:
        # An app's limits are few (one per shared resource), never one per tenant.
        return {lim.name: lim for lim in self._read(tr, *self.keys.meta_range(self.kind, app))}

    def _read_tenant(self, tr: KVTransaction, app: str, tenant: str) -> None:
        return None  # a named limit is an app's; its per-tenant part needs no record

    def _no_tenant(self) -> None:
        return None

    def of_app(self, app: str) -> dict[str, Limit]:
        """``app``'s limits by name, cached (read again when its version moved, checked at
        most once a ``refresh_s``)."""
        return self.app_part(app)

"""Paused apps, tenants and job types (issue 31 point 3), kept in the store so every
consumer and ``quick serve``'s pull leaser of a deployment holds back the same work.

A pause is one small record under ``(root, "m", "pause", app, tenant, job_type)``, an
empty string standing for "any" (names are never empty, :func:`check_name`). A pause
holds back what has not started: a visit leases no item of a paused zone and leaves items
of a paused job type vested, so no attempt is counted; running items finish, and
enqueues are accepted as ever. A visit looks up the pauses of its zone (every app's, its
app's, its tenant's; :mod:`.meta_sets`), cached and read again when the app's version
moved, checked at most once a ``refresh_s`` (1 s): a pause takes effect within about a
second, without a read per visit, and one app's pauses cost another app nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock, now_ms
from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.meta_sets import CACHE_MAX, AppSettings
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_job_type, check_name

# How long a reader keeps the pause set before reading it again: a pause or a resume takes
# effect within about this long, and a held-back zone's pointer is looked at again then.
REFRESH_S = 1.0


@dataclass(frozen=True, slots=True)
class Pause:
    """What one pause holds back: an app (every tenant and type), a tenant of an app, a
    job type (of one app, or of every app), or a job type of one tenant. None: any."""

    app: str | None = None
    tenant: str | None = None
    job_type: str | None = None
    since_ms: int = 0  # when it was paused (the store's clock); not part of its identity

    @staticmethod
    def of(app: str | None, tenant: str | None, job_type: str | None) -> Pause:
        """A checked pause: at least an app or a job type; a tenant only with its app."""
        if tenant is not None and app is None:
            raise InvalidArgument("tenant", tenant, "a tenant is paused with its app (app=...)")
        if app is None and job_type is None:
            raise InvalidArgument("pause", None, "name an app, an app and tenant, or a job type")
        return Pause(
            None if app is None else check_name("app", app),
            None if tenant is None else check_name("tenant", tenant),
            None if job_type is None else check_job_type(job_type),
        )

    @property
    def whole_zones(self) -> bool:
        """Whether it holds back every item of the zones it covers (no job type named)."""
        return self.job_type is None

    def covers(self, zone: ZoneId) -> bool:
        return (self.app is None or self.app == zone.app) and (
            self.tenant is None or self.tenant == zone.tenant
        )

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.as_dict().items() if v is not None]
        return " ".join(parts)

    def as_dict(self) -> dict[str, str | None]:
        return {"app": self.app, "tenant": self.tenant, "job_type": self.job_type}


@dataclass(frozen=True, slots=True)
class PauseSet:
    """The pauses in force as last read: what a visit asks of them."""

    pauses: tuple[Pause, ...] = ()

    def zone_paused(self, zone: ZoneId) -> bool:
        """Nothing of ``zone`` may start: its app or the tenant itself is paused."""
        return any(p.whole_zones and p.covers(zone) for p in self.pauses)

    def holds(self, zone: ZoneId, job_type: str) -> bool:
        """An item of ``job_type`` in ``zone`` may not start (a Worker's start check)."""
        return self.zone_paused(zone) or job_type in self.paused_types(zone)

    def paused_types(self, zone: ZoneId) -> frozenset[str]:
        """The job types whose items of ``zone`` may not start."""
        return frozenset(
            p.job_type for p in self.pauses if p.job_type is not None and p.covers(zone)
        )


NO_PAUSES = PauseSet()


def _field(value: str | None) -> str:
    return "" if value is None else value


def _unfield(value: object) -> str | None:
    return None if value == "" else str(value)


class Pauses(AppSettings[PauseSet, PauseSet, Pause]):
    """Sets, clears and reads pauses over the KV store; :meth:`of_zone` is the cached
    lookup a visit takes (:mod:`.meta_sets`): the pauses of every app, of the zone's app
    and of its tenant, never the others'."""

    kind = "pause"
    arity = 3  # (app, tenant, job type), "" for any

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

    def _key(self, p: Pause) -> bytes:
        return self.keys.meta_key("pause", _field(p.app), _field(p.tenant), _field(p.job_type))

    def pause(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> Pause:
        """Hold back what ``app``/``tenant``/``job_type`` names; pausing twice keeps the
        first pause's time."""
        p = Pause.of(app, tenant, job_type)
        key = self._key(p)

        def write(tr: KVTransaction) -> int:
            raw = tr.get(key)
            if raw is not None:
                return int(msgpack.unpackb(raw)["since"])
            since = now_ms(self.clock)
            self._change(tr, _field(p.app), p.tenant, key, msgpack.packb({"v": 1, "since": since}))
            return since

        since = run(self.kv, write)
        self._changed(_field(p.app))
        return Pause(p.app, p.tenant, p.job_type, since)

    def resume(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> bool:
        """Lift exactly the pause ``app``/``tenant``/``job_type`` names; False when there
        was none (a tenant's pause is not lifted by resuming its app, nor the reverse)."""
        p = Pause.of(app, tenant, job_type)
        return self._write(_field(p.app), p.tenant, self._key(p), None)

    def _decode(self, key: bytes, raw: bytes) -> Pause:
        app, tenant, job_type = self.keys.unpack(key)[-3:]
        since = int(msgpack.unpackb(raw).get("since", 0))
        return Pause(_unfield(app), _unfield(tenant), _unfield(job_type), since)

    def _read(self, tr: KVTransaction, begin: bytes, end: bytes) -> list[Pause]:
        return [self._decode(k, v) for k, v in tr.get_range(begin, end, snapshot=True)]

    def _spans(self, app: str | None) -> list[tuple[bytes, bytes]]:
        # An app's list shows the job types paused in every app (app "") too, first:
        # (pause, "", "", job type) sorts before every named app's keys.
        if app is None:
            return super()._spans(None)
        return [self.keys.meta_range("pause", "", ""), self.keys.meta_range("pause", app)]

    def _read_app(self, tr: KVTransaction, app: str) -> PauseSet:
        # (pause, app, "", job type): the whole app, or a job type of it (of every app
        # for app ""): one record a job type at most.
        return PauseSet(tuple(self._read(tr, *self.keys.meta_range("pause", app, ""))))

    def _read_tenant(self, tr: KVTransaction, app: str, tenant: str) -> PauseSet:
        return PauseSet(tuple(self._read(tr, *self.keys.meta_range("pause", app, tenant))))

    def _no_tenant(self) -> PauseSet:
        return NO_PAUSES

    def of_zone(self, zone: ZoneId) -> PauseSet:
        """The pauses that cover ``zone`` (every app's, its app's, its tenant's), cached:
        what a visit and a Worker's start check take (one memo read while current:
        :meth:`~quickzones.store.meta_sets.AppSettings._memo`)."""
        return self._memo(zone, ("",), self._of_zone)

    def _of_zone(self, zone: ZoneId) -> PauseSet:
        return PauseSet(
            self.app_part("").pauses
            + self.app_part(zone.app).pauses
            + self.tenant_part(zone).pauses
        )

    def last_of(self, zone: ZoneId) -> PauseSet | None:
        """What :meth:`of_zone` last found, however old (None: never read)."""
        everywhere, app = self.last_app_part(""), self.last_app_part(zone.app)
        if everywhere is None or app is None:
            return None
        tenant = self.last_tenant_part(zone) or NO_PAUSES
        return PauseSet(everywhere.pauses + app.pauses + tenant.pauses)

    def of_app(self, app: str) -> PauseSet:
        """Every pause of ``app`` (its tenants' too) and of every app, read now: the
        fairness view of one app."""

        def read(tr: KVTransaction) -> list[Pause]:
            return self._read(tr, *self.keys.meta_range("pause", "", "")) + self._read(
                tr, *self.keys.meta_range("pause", app)
            )

        return PauseSet(tuple(run(self.kv, read)))

"""Paused apps, tenants and job types (issue 31 point 3), kept in the store so every
consumer and ``quick serve``'s pull leaser of a deployment holds back the same work.

A pause is one small record under ``(root, "m", "pause", app, tenant, job_type)``, an
empty string standing for "any" (names are never empty, :func:`check_name`). A pause
holds back what has not started: a visit leases no item of a paused zone and leaves items
of a paused job type vested, so no attempt is counted; running items finish, and
enqueues are accepted as ever. Readers keep the whole set for ``refresh_s`` (1 s): the
set is tiny, read with a snapshot range read, and a pause takes effect within about a
second without a read per visit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from quickzones.clock import Clock, now_ms
from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.meta_sets import CachedRecordSet
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


def _field(value: str | None) -> str:
    return "" if value is None else value


def _unfield(value: object) -> str | None:
    return None if value == "" else str(value)


class Pauses(CachedRecordSet[Pause, PauseSet]):
    """Sets, clears and reads pauses over the KV store; :meth:`current` is the cached read
    consumers take each visit."""

    def __init__(
        self, kv: KVStore, keys: KeySpace, clock: Clock, refresh_s: float = REFRESH_S
    ) -> None:
        super().__init__(kv, keys, clock, refresh_s)

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
            tr.set(key, msgpack.packb({"v": 1, "since": since}))
            return since

        since = run(self.kv, write)
        self._cached = None  # this process sees its own pause at once
        return Pause(p.app, p.tenant, p.job_type, since)

    def resume(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> bool:
        """Lift exactly the pause ``app``/``tenant``/``job_type`` names; False when there
        was none (a tenant's pause is not lifted by resuming its app, nor the reverse)."""
        key = self._key(Pause.of(app, tenant, job_type))

        return self._drop(key)

    def list(self) -> list[Pause]:
        """Every pause in force, read now."""
        begin, end = self.keys.meta_range("pause")

        def read(tr: KVTransaction) -> list[Pause]:
            found = []
            for key, raw in tr.get_range(begin, end, snapshot=True):
                app, tenant, job_type = self.keys.unpack(key)[-3:]
                since = int(msgpack.unpackb(raw).get("since", 0))
                found.append(Pause(_unfield(app), _unfield(tenant), _unfield(job_type), since))
            return found

        return run(self.kv, read)

    def _set_of(self, records: Sequence[Pause]) -> PauseSet:
        return PauseSet(tuple(records))

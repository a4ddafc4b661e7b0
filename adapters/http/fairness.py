"""The dashboard's fairness view and workers page (issue 31 point 6): per tenant of an
app, what waits, what runs, how long pickups took, what is paused, and who holds too
much; and the consumers that beat in the store.

Queued and running counts come from one snapshot scan of the app's items (as the app
page's figures do); pickup latencies and history from the per-minute summaries consumers
add to the store (:mod:`quickzones.store.pickups`); consumers from their heartbeat records
(:mod:`quickzones.store.heartbeats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import fdb.tuple as fdbtuple

from quickzones.clock import now_ms
from quickzones.errors import CorruptRecord
from quickzones.store import admin, heartbeats, pickups
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.pauses import PauseSet
from quickzones.store.records import ZoneId, decode_item
from quickzones.store.tenant_limits import TenantLimit

if TYPE_CHECKING:
    from quickzones.client import Quick

# SQS fair queues' rule: a tenant holding more than this share of the running items is
# a noisy neighbour. The store knows the items consumers hold leased (running, or about to
# on a free worker), so the share is of those.
NOISY_SHARE = 0.1
PICKUP_MINUTES = 5  # the window of the p50/p99 columns


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """A tenant's weight and limits, as shown."""

    weight: str = "1"
    limits: str = "none"


def tenant_policy(q: Quick, app: str, tenant: str) -> TenantPolicy:
    """The weight and limits the fairness view shows for a tenant: the one place that
    reads them, by the lookups the consumers take (cached)."""
    zone = ZoneId(app, tenant)
    weight = q.tenant_weights.of_zone(zone) or 1.0
    limits = q.tenant_limit_store.of_zone(zone)
    return TenantPolicy(
        weight=f"{weight:g}", limits="; ".join(_limit_text(lim) for lim in limits) or "none"
    )


def _limit_text(lim: TenantLimit) -> str:
    parts = []
    if lim.max_running is not None:
        parts.append(f"{lim.max_running} running")
    if lim.rate is not None:
        parts.append(f"{lim.rate} per {lim.per_s:g} s")
    text = ", ".join(parts) or "none"
    return f"{lim.job_type}: {text}" if lim.job_type else text


@dataclass(slots=True)
class TenantRow:
    tenant: str
    queued: int = 0  # stored, not leased (vested or delayed)
    vested: int = 0  # of those, due now
    running: int = 0  # leased: a consumer holds them
    oldest_vested_ms: int | None = None
    p50_ms: int | None = None
    p99_ms: int | None = None
    picked: int = 0  # pickups in the window
    paused: str = ""  # "" | "tenant" | "app" | the paused job types
    noisy: bool = False
    policy: TenantPolicy = field(default_factory=TenantPolicy)

    def waiting_s(self, now: int) -> float:
        if self.oldest_vested_ms is None:
            return 0.0
        return round(max(0, now - self.oldest_vested_ms) / 1000, 1)


@dataclass(slots=True)
class Fairness:
    rows: list[TenantRow]
    running: int
    job_types: list[str]
    now_ms: int


def fairness(q: Quick, app: str, pauses: PauseSet) -> Fairness:
    """Every tenant of ``app`` with items or recent pickups, who waits longest first."""
    now = now_ms(q.clock)
    rows: dict[str, TenantRow] = {}
    job_types: set[str] = set()
    prefix = fdbtuple.pack((q.keys.root, "z", app))
    for key, value in admin.scan_range(q, prefix + b"\x00", prefix + b"\xff"):
        parts = q.keys.unpack(key)
        if len(parts) != 5 or parts[3] != "i":
            continue  # payload chunks, order entries, counts
        try:
            item = decode_item(key, value)
        except CorruptRecord:
            continue
        row = rows.setdefault(str(parts[2]), TenantRow(str(parts[2])))
        job_types.add(item.job_type)
        if item.lease_id is not None and item.vesting_ms > now:
            row.running += 1
            continue
        row.queued += 1
        if item.vesting_ms <= now:
            row.vested += 1
            if row.oldest_vested_ms is None or item.vesting_ms < row.oldest_vested_ms:
                row.oldest_vested_ms = item.vesting_ms
    for tenant, histogram in pickups.tenant_pickups(q.kv, q.keys, app, now, PICKUP_MINUTES).items():
        row = rows.setdefault(tenant, TenantRow(tenant))
        row.picked = histogram.total
        row.p50_ms, row.p99_ms = histogram.percentile(0.5), histogram.percentile(0.99)
    running = sum(r.running for r in rows.values())
    for row in rows.values():
        zone = ZoneId(app, row.tenant)
        row.noisy = running > 0 and row.running > NOISY_SHARE * running
        row.policy = tenant_policy(q, app, row.tenant)
        if pauses.zone_paused(zone):
            tenant_paused = any(p.tenant == row.tenant and p.whole_zones for p in pauses.pauses)
            row.paused = "tenant" if tenant_paused else "app"
        else:
            row.paused = ", ".join(sorted(pauses.paused_types(zone)))
    ordered = sorted(rows.values(), key=lambda r: (-r.waiting_s(now), -r.queued, r.tenant))
    return Fairness(ordered, running, sorted(job_types), now)


@dataclass(frozen=True, slots=True)
class MinutePoint:
    minute: int
    started: int
    p50_ms: int | None
    p99_ms: int | None


def history(q: Quick, app: str, minutes: int = 60) -> list[MinutePoint]:
    """Pickups (items started) and their p50/p99 per minute over the last ``minutes``."""
    return [
        MinutePoint(m, h.total, h.percentile(0.5), h.percentile(0.99))
        for m, h in pickups.app_history(q.kv, q.keys, app, now_ms(q.clock), minutes)
    ]


def consumers(q: Quick, allowed: set[str] | None) -> list[Heartbeat]:
    """Consumers with a heartbeat record, newest start first; with ``allowed`` (an
    app-scoped token's apps), those routed to one of them or to every app."""
    found = heartbeats.heartbeats(q.kv, q.keys)
    if allowed is not None:
        found = [h for h in found if h.apps is None or allowed & set(h.apps)]
    return sorted(found, key=lambda h: (-h.started_ms, h.consumer_id))

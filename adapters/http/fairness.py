"""The dashboard's fairness view and workers page (issue 31 point 6): per tenant of an
app, what waits, what is picked up, how long pickups took, what is paused, and who holds
too much; and the consumers that beat in the store.

At a million tenants (issue 43 point 3) the view reads a bounded amount whatever the
tenant count: it shows the tenants that matter first, in sections, each one page read
from an opaque cursor (:mod:`quickzones.store.pages`):

- **waiting**: zones whose pointer vested longest ago, from the top-level queue's vesting
  index (a pointer vests at its zone's oldest vested item; a zone a consumer is visiting
  has a leased pointer vesting later, so it is not waiting);
- **noisy**: the busiest tenants by pickups over the last few minutes
  (:func:`quickzones.store.pickups.busiest`);
- **paused**: tenants with a pause of their own, in name order;
- **capped**: tenants with a limit of their own, in name order;
- **search**: tenants whose name starts with a prefix.

Each row's figures are read for that tenant alone: its item count, its pointer, its
pickups, its pauses, weight and limits (and the slots its limit holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgpack

from quickzones.adapters.http import views
from quickzones.clock import now_ms
from quickzones.errors import InvalidArgument
from quickzones.store import heartbeats, pickups
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.kv import KVTransaction, run
from quickzones.store.pages import decode_cursor, encode_cursor, merged_page
from quickzones.store.records import ZoneId
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.tuple_layer import fdbtuple

if TYPE_CHECKING:
    from quickzones.client import Quick

# SQS fair queues' rule: a tenant with more than this share of the app's pickups over the
# window is a noisy neighbour.
NOISY_SHARE = 0.1
PICKUP_MINUTES = 5  # the window of the p50/p99 columns and of the noisy ranking
SECTIONS = ("waiting", "noisy", "paused", "capped")
FIRST = 10  # rows of each section on the view's first page
PAGE = 50  # rows of one section's own page, unless asked for fewer or more
MAX_LIMIT = 100  # rows of one section's page, at most
_SKIP = 500  # keys a section's page may pass over, per shard, before it ends short
_TITLES = {
    "waiting": "Waiting longest",
    "noisy": "Noisiest (most pickups, last 5 min)",
    "paused": "Paused",
    "capped": "Capped (with a limit of their own)",
    "search": "Search",
}


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
    queued: int = 0  # items stored: vested, delayed or leased
    waiting_since_ms: int | None = None  # its pointer vested then; None: not waiting
    visiting: bool = False  # a consumer holds its pointer's lease
    p50_ms: int | None = None
    p99_ms: int | None = None
    picked: int = 0  # pickups in the window
    paused: str = ""  # "" | "tenant" | "app" | the paused job types
    noisy: bool = False
    held: int | None = None  # slots its own max_running limit holds (None: no such limit)
    policy: TenantPolicy = field(default_factory=TenantPolicy)


@dataclass(slots=True)
class Section:
    name: str
    title: str
    rows: list[TenantRow]
    next_cursor: str | None


@dataclass(slots=True)
class Fairness:
    sections: list[Section]
    picked: int  # the app's pickups in the window
    now_ms: int

    @property
    def noisy_shown(self) -> int:
        return len({r.tenant for s in self.sections for r in s.rows if r.noisy})


def fairness(
    q: Quick,
    app: str,
    *,
    section: str | None = None,
    cursor: str | None = None,
    limit: int = FIRST,
    search: str | None = None,
) -> Fairness:
    """The view of ``app``: with neither ``section`` nor ``search``, the first ``limit``
    rows of every section; else one page of that section (``search``: tenants whose name
    starts with it). :class:`InvalidArgument` for an unknown section, a limit out of
    range or a cursor not of this section."""
    if section is not None and section not in SECTIONS:
        raise InvalidArgument("section", section, f"one of {', '.join(SECTIONS)}")
    if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument("limit", limit, f"must be from 1 to {MAX_LIMIT}")
    if cursor is not None and section is None and not search:
        raise InvalidArgument("cursor", cursor, "a cursor pages one section: name it")
    now = now_ms(q.clock)
    picked = pickups.app_total(q.kv, q.keys, app, now, PICKUP_MINUTES)
    wanted = ["search"] if search else [section] if section is not None else list(SECTIONS)
    pages = [(name, *_PAGES[name](q, app, now, limit, cursor, search or "")) for name in wanted]
    shown = list(dict.fromkeys(t for _, tenants, _ in pages for t in tenants))
    rows = dict(zip(shown, _rows(q, app, shown, now, picked), strict=True))
    out = [
        Section(name, _TITLES[name], [rows[t] for t in tenants], next_cursor)
        for name, tenants, next_cursor in pages
    ]
    return Fairness(out, picked, now)


Pager = Callable[["Quick", str, int, int, "str | None", str], tuple[list[str], "str | None"]]


def _waiting(
    q: Quick, app: str, now: int, limit: int, cursor: str | None, _: str
) -> tuple[list[str], str | None]:
    """The app's zones in pointer vesting order (vested pointers only), from the
    top-level queue (:meth:`~quickzones.store.toplevel.TopLevelQueue.vested_zone_page`)."""
    after = None if cursor is None else decode_cursor(b"", cursor, 2)
    tenants, next_after = q.toplevel.vested_zone_page(app, now, limit, after=after, skip=_SKIP)
    return tenants, None if next_after is None else encode_cursor(b"", next_after)


def _noisy(
    q: Quick, app: str, now: int, limit: int, cursor: str | None, _: str
) -> tuple[list[str], str | None]:
    """The busiest tenants, ranked; the cursor is the rank the next page starts at."""
    offset = 0
    if cursor is not None:
        (rank,) = fdbtuple.unpack(decode_cursor(b"", cursor, 1))
        if not isinstance(rank, int) or not 0 < rank < pickups.BUSIEST_MAX:
            raise InvalidArgument("cursor", cursor, "not a cursor of this list")
        offset = rank
    ranked = pickups.busiest(q.kv, q.keys, app, now, PICKUP_MINUTES, first=offset + limit + 1)
    page = [tenant for tenant, _ in ranked[offset : offset + limit]]
    more = len(ranked) > offset + limit and offset + limit < pickups.BUSIEST_MAX
    return page, encode_cursor(b"", fdbtuple.pack((offset + limit,))) if more else None


def _own_settings(kind: str) -> Pager:
    """A page of the tenants with a setting of their own of ``kind`` (pauses, limits),
    in name order: the keys (kind, app, tenant, job_type), from the cursor's tenant on."""

    def page(
        q: Quick, app: str, now: int, limit: int, cursor: str | None, _: str
    ) -> tuple[list[str], str | None]:
        base = q.keys.meta_key(kind, app)
        # (kind, app, "", ...) are the app's own settings, which name no tenant; a
        # cursor names the tenant every setting of which the last page showed.
        begin = q.keys.meta_key(kind, app, "") + b"\xff"
        if cursor is not None:
            begin = max(begin, base + decode_cursor(b"", cursor, 1) + b"\xff")
        shown: list[str] = []

        def match(tr: KVTransaction, key: bytes, _: bytes) -> str | None:
            tenant = str(q.keys.unpack(key)[-2])
            if shown and shown[-1] == tenant:
                return None  # another job type's setting of the tenant just shown
            shown.append(tenant)
            return tenant

        tenants, next_after = merged_page(
            q.kv, [(base, begin, base + b"\xff")], limit=limit, after=None, match=match,
            skip=_SKIP,
        )  # fmt: skip
        if next_after is None:
            return tenants, None
        return tenants, encode_cursor(b"", fdbtuple.pack(fdbtuple.unpack(next_after)[:1]))

    return page


def _search(
    q: Quick, app: str, now: int, limit: int, cursor: str | None, search: str
) -> tuple[list[str], str | None]:
    return views.tenant_page(q, app, limit=limit, cursor=cursor, prefix=search)


_PAGES: dict[str, Pager] = {
    "waiting": _waiting,
    "noisy": _noisy,
    "paused": _own_settings("pause"),
    "capped": _own_settings("tenant_limit"),
    "search": _search,
}


def _rows(q: Quick, app: str, tenants: list[str], now: int, app_picked: int) -> list[TenantRow]:
    """Each tenant's figures, read for it alone (one snapshot for them all); weights,
    limits and pauses by the cached lookups the consumers take."""

    if not tenants:
        return []
    queued = q.items.counts([ZoneId(app, tenant) for tenant in tenants])

    def read(tr: KVTransaction) -> list[TenantRow]:
        return [
            _row_in(tr, q, app, tenant, now, app_picked, n)
            for tenant, n in zip(tenants, queued, strict=True)
        ]

    return run(q.kv, read)


def _row_in(
    tr: KVTransaction, q: Quick, app: str, tenant: str, now: int, app_picked: int, queued: int
) -> TenantRow:
    zone = ZoneId(app, tenant)
    row = TenantRow(tenant, queued=queued)
    pointer = q.toplevel.get_pointer(zone, tr=tr)
    if pointer is not None and pointer.vesting_ms <= now:
        row.waiting_since_ms = pointer.vesting_ms
    elif pointer is not None and pointer.lease_id is not None:
        row.visiting = True
    histogram = pickups.tenant_histogram(tr, q.keys, app, tenant, now, PICKUP_MINUTES)
    row.picked = histogram.total
    row.p50_ms, row.p99_ms = histogram.percentile(0.5), histogram.percentile(0.99)
    row.noisy = app_picked > 0 and row.picked > NOISY_SHARE * app_picked
    row.policy = tenant_policy(q, app, tenant)
    limits = q.tenant_limit_store.of_zone(zone)
    if any(lim.job_type is None and lim.max_running is not None for lim in limits):
        row.held = 0
        begin, end = q.keys.meta_range("slots", "tenant", app, tenant)
        for key, raw in tr.get_range(begin, end, snapshot=True):
            if len(q.keys.unpack(key)) == 6:  # (m, slots, tenant, app, tenant, holder)
                n, expires = msgpack.unpackb(raw)
                row.held += n if expires > now else 0
    pauses = q.pauses.of_zone(zone)
    if pauses.zone_paused(zone):
        tenant_paused = any(p.tenant == tenant and p.whole_zones for p in pauses.pauses)
        row.paused = "tenant" if tenant_paused else "app"
    else:
        row.paused = ", ".join(sorted(pauses.paused_types(zone)))
    return row


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

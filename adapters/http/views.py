"""Admin reads the server and dashboard need, scoped to one app and paged, so a page of a
store with 100,000 zones reads one page of keys, not the store. Snapshot reads only: none
conflicts with producers or consumers. Whole-store figures come from
:mod:`quickzones.store.admin`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quickzones.adapters.http.models import ZoneDepth
from quickzones.clock import now_ms
from quickzones.errors import CorruptRecord
from quickzones.store import admin, dead_groups
from quickzones.store.pages import decode_cursor, encode_cursor
from quickzones.store.records import DeadLetter, WorkItem, ZoneId, decode_item
from quickzones.store.tuple_layer import fdbtuple

if TYPE_CHECKING:
    from quickzones.client import Quick


def all_apps(q: Quick) -> set[str]:
    """Apps with at least one active zone (:meth:`TopLevelQueue.apps
    <quickzones.store.toplevel.TopLevelQueue.apps>`)."""
    return q.toplevel.apps()


_ZONE_SKIP = 1000  # tenant keys a search may pass over, per shard, before a page ends short


def tenant_page(
    q: Quick,
    app: str,
    *,
    limit: int,
    cursor: str | None = None,
    contains: str | None = None,
    prefix: str | None = None,
) -> tuple[list[str], str | None]:
    """One page of an app's active zones' tenants, in name order from ``cursor``, and
    the next page's cursor (``None``: the last page): the top-level queue's
    :meth:`~quickzones.store.toplevel.TopLevelQueue.zone_page`, at most ``limit + 1``
    keys a shard, or with ``contains`` (a substring) at most ``_ZONE_SKIP`` more.
    ``prefix`` reads only the tenants whose name starts with it. No total: counting
    would read every zone."""
    after = None if cursor is None else decode_cursor(b"", cursor, 1)
    tenants, after_next = q.toplevel.zone_page(
        app, limit, after=after, contains=contains, prefix=prefix, skip=_ZONE_SKIP
    )
    return tenants, None if after_next is None else encode_cursor(b"", after_next)


def zone_depth_page(
    q: Quick, app: str, *, search: str | None = None, limit: int, cursor: str | None = None
) -> tuple[list[ZoneDepth], str | None]:
    """One page of an app's active zones by tenant from ``cursor`` (:func:`tenant_page`,
    ``search`` a substring), and the next page's cursor (``None``: the last page)."""
    tenants, next_cursor = tenant_page(q, app, limit=limit, cursor=cursor, contains=search)
    return zone_depths_of(q, app, tenants), next_cursor


def zone_depths_of(q: Quick, app: str, tenants: list[str]) -> list[ZoneDepth]:
    """Item counts and pointer state of these tenants' zones (one page)."""
    zones = [ZoneId(app, t) for t in tenants]
    counts = q.items.counts(zones) if zones else []
    out = []
    for zone, count in zip(zones, counts, strict=True):
        pointer = q.toplevel.get_pointer(zone)
        out.append(
            ZoneDepth(
                tenant=zone.tenant,
                items=count,
                leased=pointer is not None and pointer.lease_id is not None,
                pointer_vesting_ms=None if pointer is None else pointer.vesting_ms,
            )
        )
    return out


# Keys a page's figures of an app's items read at most (the item records, their order
# entries and counts, in (tenant, id) order): what lies past them is not counted.
SCAN_KEYS = 5000
# Keys of an app's zone index (one per active zone) its active-zone figure reads at most.
ZONE_KEYS = 1000


@dataclass(slots=True)
class AppFigures:
    items: int = 0
    vested: int = 0
    leased: int = 0
    corrupt: int = 0
    oldest_vested_ms: int | None = None
    by_job_type: Counter[str] = field(default_factory=Counter)
    by_tenant: Counter[str] = field(default_factory=Counter)
    exact: bool = True  # every item of the app was read; else the first SCAN_KEYS keys'


def app_figures(q: Quick, app: str, *, max_keys: int | None = SCAN_KEYS) -> AppFigures:
    """Counts of one app's items by state, job type and tenant, from a scan of its zones'
    keys that stops after ``max_keys`` (``None``: reads them all): no counter of these is
    kept per item (an atomic add on every enqueue and completion would be a hot key), so a
    page shows the figures of the items it read and says whether that was all of them."""
    prefix = fdbtuple.pack((q.keys.root, "z", app))
    now = now_ms(q.clock)
    out = AppFigures()
    rows = admin.scan_range(q, prefix + b"\x00", prefix + b"\xff", max_keys=max_keys)
    if max_keys is not None and len(rows) > max_keys:
        out.exact = False
        del rows[max_keys:]
    for key, value in rows:
        parts = q.keys.unpack(key)
        if len(parts) != 5 or parts[3] != "i":
            continue
        try:
            item = decode_item(key, value)
        except CorruptRecord:
            out.corrupt += 1
            continue
        out.items += 1
        out.by_job_type[item.job_type] += 1
        out.by_tenant[str(parts[2])] += 1
        if item.lease_id is not None and item.vesting_ms > now:
            out.leased += 1
        elif item.vesting_ms <= now:
            out.vested += 1
            if out.oldest_vested_ms is None or item.vesting_ms < out.oldest_vested_ms:
                out.oldest_vested_ms = item.vesting_ms
    return out


def dead_letter_total(q: Quick, app: str) -> dead_groups.Total:
    """``app``'s dead letters: its counter, two key reads. A store written before the
    counters is counted by the server's own thread (``admin.count_dead_letters_online``),
    not by a page: until it ends, the count so far, not exact."""
    return dead_groups.total(q.kv, q.keys, app, steps=0)


def active_zone_count(q: Quick, app: str, *, max_keys: int = ZONE_KEYS) -> tuple[int, bool]:
    """How many of ``app``'s zones have a pointer, and whether that is all of them: the
    app's zone index read up to ``max_keys`` keys over all shards
    (:meth:`~quickzones.store.toplevel.TopLevelQueue.zone_count`)."""
    return q.toplevel.zone_count(app, max_keys)


def zone_items(
    q: Quick, zone: ZoneId, *, offset: int = 0, limit: int
) -> tuple[int, list[WorkItem]]:
    """The zone's item count and ``limit`` of its items (every state) after the first
    ``offset``, in id order: it reads ``offset + limit`` items (pages use a cursor,
    :func:`quickzones.store.admin.zone_item_page`, and read only what they show)."""
    total, page = admin.zone_item_page(q, zone, limit=offset + limit)
    return total, page.rows[offset:]


def item_state(item: WorkItem, now: int) -> str:
    if item.lease_id is not None and item.vesting_ms > now:
        return "leased"
    return "vested" if item.vesting_ms <= now else "queued"


def dead_letters(
    q: Quick,
    app: str,
    *,
    tenant: str | None = None,
    job_type: str | None = None,
    item_id: str | None = None,
    limit: int | None = None,
) -> list[DeadLetter]:
    """Dead letters of ``app`` a bulk requeue or purge acts on, at most ``limit``; every
    filter given filters (read a page at a time; an id is found by key, not by a scan)."""
    out: list[DeadLetter] = []
    for letter in admin.iter_dead_letters(q, app, tenant, job_type=job_type, item_id=item_id):
        if limit is not None and len(out) >= limit:
            break
        out.append(letter)
    return out


# Pointer records of each shard its figures read at most.
POINTER_KEYS = 1000


def pointers_by_shard(q: Quick) -> list[tuple[int, int, int, int, bool]]:
    """(shard, pointers, vested, leased, exact) of every shard of the cluster, from at
    most :data:`POINTER_KEYS` pointer records a shard: not exact, the counts are of the
    pointers read (the first by pointer id), at least."""
    now = now_ms(q.clock)
    out = []
    for shard in range(q.toplevel.shards):
        read = q.toplevel.list_pointers(shard, limit=POINTER_KEYS + 1)
        exact = len(read) <= POINTER_KEYS
        pointers = [p for p in read[:POINTER_KEYS] if not p.local]
        vested = sum(1 for p in pointers if p.vesting_ms <= now)
        leased = sum(1 for p in pointers if p.lease_id is not None and p.vesting_ms > now)
        out.append((shard, len(pointers), vested, leased, exact))
    return out

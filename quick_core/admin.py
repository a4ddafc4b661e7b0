"""Admin reads and repairs: stats, active zones, dead letters. Snapshot reads throughout,
so none of them conflicts with producers or consumers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quick_core.errors import CorruptRecord, ItemNotFound
from quick_core.kv import KVTransaction, run, unpack_i64
from quick_core.records import DeadLetter, ZoneId, decode_dead_letter, decode_item
from quick_core.zonestore import NewItem

if TYPE_CHECKING:
    from quick_core.client import Quick

_PAGE = 1000


@dataclass(slots=True)
class ZoneSummary:
    zone: ZoneId
    count: int
    pointer_vesting_ms: int | None
    leased: bool


@dataclass(slots=True)
class Stats:
    items_by_zone: Counter[tuple[str, str]] = field(default_factory=Counter)
    items_by_app: Counter[str] = field(default_factory=Counter)
    items_by_job_type: Counter[str] = field(default_factory=Counter)
    vested: int = 0
    leased: int = 0
    corrupt: int = 0
    active_zones: int = 0
    dead_letters: int = 0


def _scan(q: Quick, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    """All pairs of a range, page by page, each page its own short snapshot transaction so
    a large store never hits the 5 s transaction lifetime."""
    out: list[tuple[bytes, bytes]] = []
    cursor = begin
    while True:

        def page(tr: KVTransaction, start: bytes = cursor) -> list[tuple[bytes, bytes]]:
            return tr.get_range(start, end, limit=_PAGE, snapshot=True)

        rows = run(q.kv, page)
        out.extend(rows)
        if len(rows) < _PAGE:
            return out
        cursor = rows[-1][0] + b"\x00"


def active_zones(q: Quick) -> list[ZoneSummary]:
    """Zones that have a pointer, with their item counts."""
    out = []
    for shard in range(q.toplevel.shards):
        for pointer in q.toplevel.list_pointers(shard):
            if pointer.local:
                continue
            out.append(
                ZoneSummary(
                    pointer.zone,
                    q.zones.count(pointer.zone),
                    pointer.vesting_ms,
                    pointer.lease_id is not None,
                )
            )
    return sorted(out, key=lambda z: (z.zone.app, z.zone.tenant))


def stats(q: Quick) -> Stats:
    """Counts per app, tenant and job type; scans every item (an admin command)."""
    result = Stats()
    now = int(q.clock.now() * 1000)
    begin, end = q.keys.all_zones_range()
    for key, value in _scan(q, begin, end):
        parts = q.keys.unpack(key)
        if len(parts) != 5 or parts[3] != "i":
            continue  # order entries, counts and payload chunks
        app, tenant = str(parts[1]), str(parts[2])
        try:
            item = decode_item(key, value)
        except CorruptRecord:
            result.corrupt += 1
            continue
        result.items_by_zone[(app, tenant)] += 1
        result.items_by_app[app] += 1
        result.items_by_job_type[item.job_type] += 1
        if item.lease_id is not None and item.vesting_ms > now:
            result.leased += 1
        elif item.vesting_ms <= now:
            result.vested += 1
    result.active_zones = sum(q.toplevel.count_pointers(s) for s in range(q.toplevel.shards))
    result.dead_letters = len(_scan(q, *q.keys.dead_letters_range()))
    return result


def zone_count(q: Quick, zone: ZoneId) -> int:
    return run(q.kv, lambda tr: unpack_i64(tr.get(q.keys.count_key(zone), snapshot=True)))


def list_dead_letters(
    q: Quick, app: str | None = None, tenant: str | None = None
) -> list[DeadLetter]:
    out = []
    for key, value in _scan(q, *q.keys.dead_letters_range(app, tenant)):
        parts = q.keys.unpack(key)
        zone = ZoneId(str(parts[1]), str(parts[2]))
        out.append(decode_dead_letter(key, value, zone, str(parts[3])))
    return out


def requeue_dead_letter(q: Quick, zone: ZoneId, item_id: str) -> str:
    """Put a dead letter back into its zone with a clean error count, in one transaction
    with the dead letter's removal; corrupt records cannot be requeued."""
    key = q.keys.dead_letter_key(zone, item_id)

    def move(tr: KVTransaction) -> tuple[str, int, bool]:
        raw = tr.get(key)
        if raw is None:
            raise ItemNotFound(item_id)
        letter = decode_dead_letter(key, raw, zone, item_id)
        if letter.item is None:
            raise CorruptRecord(key, "the dead item's record is corrupt; it cannot be requeued")
        item = letter.item
        tr.clear(key)
        return q.zones.enqueue_in(
            tr,
            zone,
            NewItem(
                job_type=item.job_type,
                payload=item.payload,
                priority=item.priority,
                item_id=item.item_id,
                content_type=item.content_type,
                delivery=item.delivery,
            ),
        )

    new_id, vesting, needs_pull = run(q.kv, move)
    if needs_pull:
        q.toplevel.pull_pointer_earlier(zone, vesting)
    return new_id


def purge_dead_letters(q: Quick, app: str | None = None, tenant: str | None = None) -> int:
    begin, end = q.keys.dead_letters_range(app, tenant)
    n = len(_scan(q, begin, end))
    run(q.kv, lambda tr: tr.clear_range(begin, end))
    return n

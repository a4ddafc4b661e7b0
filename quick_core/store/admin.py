"""Admin reads and repairs: stats, active zones, dead letters. Snapshot reads throughout,
so none of them conflicts with producers or consumers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.consumer.scanner_election import lease_name
from quickzones.consumer.store_election import LeaseRecord, StoreElection
from quickzones.errors import CorruptRecord, ItemAlreadyQueued, ItemNotFound
from quickzones.store import enqueue as two_part
from quickzones.store.kv import KVTransaction, run, unpack_i64
from quickzones.store.pauses import Pause
from quickzones.store.pointer_repair import SetAsidePointer, decode_set_aside
from quickzones.store.records import DeadLetter, ZoneId, decode_dead_letter, decode_item
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.validation import check_name
from quickzones.store.weights import TenantWeight

if TYPE_CHECKING:
    from quickzones.client import Quick

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
    corrupt_pointers: int = 0  # pointer records set aside (set_aside_pointers)
    # The top-level queue's in-order scanner lease as stored (held or last held), and
    # the store time it was read at.
    in_order_scanner: LeaseRecord | None = None
    read_at_ms: int = 0
    paused: list[Pause] = field(default_factory=list)  # the pauses in force
    weights: list[TenantWeight] = field(default_factory=list)  # tenant weights stored
    tenant_limits: list[TenantLimit] = field(default_factory=list)  # per-tenant limits


def scan_range(q: Quick, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
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
    q.toplevel.refresh_layout()  # a long-lived process (quick serve) sees a reshard
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
    for key, value in scan_range(q, begin, end):
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
    q.toplevel.refresh_layout()
    result.active_zones = sum(q.toplevel.count_pointers(s) for s in range(q.toplevel.shards))
    result.dead_letters = len(_letter_rows(q, None, None))
    result.corrupt_pointers = len(scan_range(q, *q.keys.bad_pointers_range(q.toplevel.cluster)))
    election = StoreElection(q.kv, q.keys, q.clock)
    result.in_order_scanner = election.read(lease_name(q.toplevel.cluster))
    result.read_at_ms = now_ms(q.clock)
    result.paused = q.paused()
    result.weights = q.weights()
    result.tenant_limits = q.tenant_limits()
    return result


def set_aside_pointers(q: Quick) -> list[SetAsidePointer]:
    """Pointer records of ``q``'s cluster that could not be decoded and were set aside
    (``pointer_repair.set_aside``), each with its bytes and the zone it was rebuilt for."""
    cluster = q.toplevel.cluster
    out = []
    for key, value in scan_range(q, *q.keys.bad_pointers_range(cluster)):
        shard, pointer_id = q.keys.unpack(key)[3:5]
        out.append(decode_set_aside(cluster, int(str(shard)), str(pointer_id), value))
    return out


def zone_count(q: Quick, zone: ZoneId) -> int:
    return run(q.kv, lambda tr: unpack_i64(tr.get(q.keys.count_key(zone), snapshot=True)))


_Row = tuple[ZoneId, str, bytes, bytes, list[bytes]]


def _letter_rows(q: Quick, app: str | None, tenant: str | None) -> list[_Row]:
    """(zone, item_id, key, record, chunk values) of every dead letter the filters select.

    An app is a key prefix; a tenant alone is not, so it filters the keys scanned."""
    out: list[_Row] = []
    for key, value in scan_range(q, *q.keys.dead_letters_range(app)):
        parts = q.keys.unpack(key)
        if len(parts) == 5 and out:
            last = out[-1]
            if parts[1:4] == (last[0].app, last[0].tenant, last[1]):
                last[4].append(value)  # a chunk of the record just before it
            continue
        if len(parts) != 4:
            continue  # a chunk whose record is gone (or not selected)
        zone = ZoneId(str(parts[1]), str(parts[2]))
        if tenant is not None and zone.tenant != tenant:
            continue
        out.append((zone, str(parts[3]), key, value, []))
    return out


def list_dead_letters(
    q: Quick,
    app: str | None = None,
    tenant: str | None = None,
    *,
    job_type: str | None = None,
    limit: int | None = None,
) -> list[DeadLetter]:
    """Dead letters, of one app, one tenant (in every app) or one zone, of one job type,
    at most ``limit`` of them; each with its whole item. Every filter given filters (a
    corrupt letter has no job type: a job-type filter leaves it out)."""
    out: list[DeadLetter] = []
    for zone, item_id, key, value, chunks in _letter_rows(q, app, tenant):
        if limit is not None and len(out) >= limit:
            break
        try:
            letter: DeadLetter | None = decode_dead_letter(
                key, value, zone, item_id, chunks or None
            )
        except CorruptRecord:
            # The scan pages are separate snapshots: a letter rewritten between two of
            # them is read again, whole, in one transaction.
            letter = q.zones.read_dead_letter(zone, item_id, snapshot=True)
        if letter is None:
            continue
        if job_type is not None and (letter.item is None or letter.item.job_type != job_type):
            continue
        out.append(letter)
    return out


# A bulk requeue moves letters in transactions of at most this many letters and (a
# letter past the first) this many payload bytes: far inside the 10 MB and 5 s limits, and
# a crash between two of them leaves every letter either still dead or queued, never both
# and never neither.
_MOVE_LETTERS = 100
_MOVE_BYTES = 1_000_000


@dataclass(slots=True)
class Requeued:
    """What a bulk requeue did: how many letters went back into their zones, the letters
    kept because their id is queued in the zone again, the corrupt ones (only a purge
    removes those), and how many were requeued or purged by someone else meanwhile."""

    requeued: int = 0
    kept: list[DeadLetter] = field(default_factory=list)
    corrupt: list[DeadLetter] = field(default_factory=list)
    gone: int = 0


def _move(q: Quick, tr: KVTransaction, zone: ZoneId, item_id: str) -> str:
    """Take one dead letter and enqueue its item in ``tr``: both happen or neither. The
    two-part enqueue's part two follows the commit."""
    item = q.zones.take_dead_letter(zone, item_id, tr=tr)
    return two_part.part_one(tr, q.toplevel, q.zones, zone, item).item_id


def requeue_dead_letter(q: Quick, zone: ZoneId, item_id: str) -> str:
    """Put a dead letter back into its zone with a clean error count, in one transaction
    with the dead letter's removal: both happen or neither.

    :class:`~quickzones.errors.ItemAlreadyQueued` if the zone already holds an item with
    this id (the dead letter is kept); corrupt records cannot be requeued."""
    check_name("item_id", item_id)
    requeued = run(q.kv, lambda tr: _move(q, tr, zone, item_id))
    q.wake_waiters()
    return requeued


def _batches(letters: list[DeadLetter]) -> list[list[DeadLetter]]:
    out: list[list[DeadLetter]] = []
    size = 0
    for letter in letters:
        payload = 0 if letter.item is None else len(letter.item.payload)
        if not out or len(out[-1]) >= _MOVE_LETTERS or size + payload > _MOVE_BYTES:
            out.append([])
            size = 0
        out[-1].append(letter)
        size += payload
    return out


def requeue(q: Quick, letters: Sequence[DeadLetter], limit: int | None = None) -> Requeued:
    """Put these dead letters (at most ``limit`` of them, corrupt ones reported and not
    counted) back into their zones, with a clean error count, in bounded transactions,
    each moving its letters all or nothing. A letter whose id is queued in its zone again
    is kept and reported; one requeued or purged meanwhile is counted as gone."""
    result = Requeued(corrupt=[d for d in letters if d.item is None])
    for batch in _batches([d for d in letters if d.item is not None][:limit]):

        def move(tr: KVTransaction, batch: list[DeadLetter] = batch) -> Requeued:
            done = Requeued()
            for letter in batch:
                try:
                    _move(q, tr, letter.zone, letter.item_id)
                except ItemAlreadyQueued:
                    done.kept.append(letter)  # raised before anything was written
                    continue
                except (ItemNotFound, CorruptRecord):
                    done.gone += 1  # requeued, purged or rewritten meanwhile
                    continue
                done.requeued += 1
            return done

        done = run(q.kv, move)
        result.requeued += done.requeued
        result.kept.extend(done.kept)
        result.gone += done.gone
        q.wake_waiters()
    return result


def requeue_dead_letters(
    q: Quick,
    app: str | None = None,
    tenant: str | None = None,
    *,
    job_type: str | None = None,
    limit: int | None = None,
) -> Requeued:
    """:func:`requeue` the dead letters :func:`list_dead_letters` selects with the same
    filters, at most ``limit`` of them."""
    return requeue(q, list_dead_letters(q, app, tenant, job_type=job_type), limit)


def purge(q: Quick, letters: Sequence[DeadLetter]) -> int:
    """Delete exactly these dead letters (each with its chunks), a page a transaction;
    returns how many."""
    for start in range(0, len(letters), _PAGE):
        page = letters[start : start + _PAGE]

        def clear(tr: KVTransaction, page: Sequence[DeadLetter] = page) -> None:
            for letter in page:
                tr.clear_range(*q.keys.dead_letter_range_of(letter.zone, letter.item_id))

        run(q.kv, clear)
    return len(letters)


def purge_dead_letters(
    q: Quick,
    app: str | None = None,
    tenant: str | None = None,
    *,
    job_type: str | None = None,
    limit: int | None = None,
) -> int:
    """Delete exactly the dead letters :func:`list_dead_letters` selects with the same
    filters (each with its chunks); returns how many. A letter that arrives meanwhile is
    not touched."""
    return purge(q, list_dead_letters(q, app, tenant, job_type=job_type, limit=limit))

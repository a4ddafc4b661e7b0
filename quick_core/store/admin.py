"""Admin reads and repairs: stats, active zones, dead letters. Snapshot reads throughout,
so none of them conflicts with producers or consumers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.consumer.scanner_election import lease_name
from quickzones.consumer.store_election import LeaseRecord, StoreElection
from quickzones.errors import CorruptRecord, InvalidArgument, ItemAlreadyQueued, ItemNotFound
from quickzones.store import dead_groups, flow_keys
from quickzones.store import enqueue as two_part
from quickzones.store.dead_groups import letter_group
from quickzones.store.kv import KVTransaction, get_many, run
from quickzones.store.pages import Page, after, check_limit, decode_cursor, encode_cursor
from quickzones.store.pauses import Pause
from quickzones.store.pointer_repair import SetAsidePointer, decode_set_aside
from quickzones.store.records import (
    DeadLetter,
    WorkItem,
    ZoneId,
    decode_dead_letter,
    decode_item,
)
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


def scan_range(
    q: Quick, begin: bytes, end: bytes, *, max_keys: int | None = None
) -> list[tuple[bytes, bytes]]:
    """All pairs of a range, page by page, each page its own short snapshot transaction so
    a large store never hits the 5 s transaction lifetime; with ``max_keys``, at most
    ``max_keys + 1`` of its first pairs (more than ``max_keys``: the range goes on)."""
    out: list[tuple[bytes, bytes]] = []
    cursor = begin
    while True:
        want = _PAGE if max_keys is None else min(_PAGE, max_keys + 1 - len(out))

        def page(
            tr: KVTransaction, start: bytes = cursor, n: int = want
        ) -> list[tuple[bytes, bytes]]:
            return tr.get_range(start, end, limit=n, snapshot=True)

        rows = run(q.kv, page)
        out.extend(rows)
        if len(rows) < want or (max_keys is not None and len(out) > max_keys):
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
                    q.items.count(pointer.zone),
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
    result.dead_letters = count_dead_letters(q)
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
    """The zone's item count, from the store its items live in."""
    return q.items.count(zone)


_Row = tuple[ZoneId, str, bytes, bytes, list[bytes]]


# A page of dead letters passes over at most this many letters its filters leave out (a
# job type, an id, a tenant's letters in other apps' key ranges) before it ends short with a
# cursor: what a page reads is bounded by what it shows plus this, whatever lies behind it.
_SKIP = 1000
_LETTER_ARITY = 3  # a cursor names (app, tenant, item_id) below (root, "d")


def _jump(
    q: Quick, zone: ZoneId, item_id: str, tenant: str | None, wanted: str | None
) -> bytes | None:
    """Where to read next when the letter at (zone, item_id) is not of ``tenant`` or not
    ``wanted`` (an id), both parts of the key: past the keys that cannot match, so a
    tenant's letters across apps, or one id, cost one read per app or tenant passed, not
    one per letter. ``None``: the letter matches the key's filters."""
    if tenant is not None and zone.tenant != tenant:
        if zone.tenant < tenant:  # str order is the tuple layer's UTF-8 byte order
            target = ZoneId(zone.app, tenant)
            if wanted is not None:
                return q.keys.dead_letter_key(target, wanted)
            return q.keys.dead_letters_zone_range(target)[0]
        return q.keys.dead_letters_range(zone.app)[1]  # the app's next app
    if wanted is not None and item_id != wanted:
        if item_id < wanted:
            return q.keys.dead_letter_key(zone, wanted)
        return q.keys.dead_letters_zone_range(zone)[1]  # the next tenant
    return None


def _decode(q: Quick, zone: ZoneId, item_id: str, key: bytes, value: bytes,
            chunks: list[bytes]) -> DeadLetter | None:  # fmt: skip
    try:
        return decode_dead_letter(key, value, zone, item_id, chunks or None)
    except CorruptRecord:
        # Its chunks ran past the end of the read (or it was rewritten meanwhile): read
        # it again, whole, in one transaction.
        return q.zones.read_dead_letter(zone, item_id, snapshot=True)


def dead_letter_page(
    q: Quick,
    app: str | None = None,
    tenant: str | None = None,
    *,
    job_type: str | None = None,
    item_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[DeadLetter]:
    """One page of dead letters in key order (app, tenant, id), from ``cursor`` (a page's
    ``next_cursor``; ``None``: the first page), at most ``limit`` of them; every filter
    given filters. It reads the letters it shows, plus at most ``_SKIP`` letters its
    filters leave out, in short snapshot transactions: its cost does not grow with the
    letters behind it. A page may hold fewer than ``limit`` letters and still have a next
    one; the list ends where ``next_cursor`` is ``None``. Letters added or removed between
    two pages never make another letter repeat or be missed.

    :class:`~quickzones.errors.InvalidArgument` for a cursor that is not one of this
    list's (made by hand, cut short, or from another app's list)."""
    check_limit(limit)
    if app is not None and tenant is not None:
        begin, end = q.keys.dead_letters_zone_range(ZoneId(app, tenant))
    else:
        begin, end = q.keys.dead_letters_range(app)
    base = q.keys.dead_letters_range()[0][:-1]  # (root, "d")
    start = begin
    if cursor is not None:
        key = decode_cursor(base, cursor, _LETTER_ARITY)
        if not begin <= key < end:
            raise InvalidArgument("cursor", cursor, "not a cursor of this list")
        start = after(key)
    if app is not None and tenant is not None and item_id is not None:
        # One letter, read directly.
        zone = ZoneId(app, tenant)
        key = q.keys.dead_letter_key(zone, item_id)
        one = None if start > key else q.zones.read_dead_letter(zone, item_id, snapshot=True)
        keep = one is not None and (job_type is None or (
            one.item is not None and one.item.job_type == job_type))  # fmt: skip
        return Page([one] if keep and one is not None else [], None)
    # A tenant without an app, or an id without a tenant, is not one key range: the read
    # jumps between the ranges that can match (_jump) and, once in one, reads only it.
    jumping = (tenant is not None and app is None) or (item_id is not None and tenant is None)
    filtered = job_type is not None or jumping
    shown: list[tuple[bytes, DeadLetter]] = []
    wasted = 0  # keys read and not shown: bounded by _SKIP (plus one read)
    last: bytes | None = None  # the last letter's key this page considered
    probe = jumping  # the next read lands where a jump led: read one key first
    stop = end  # the end of this read: the list's, or of the matching range it is in
    while True:
        need = limit + 1 - len(shown)
        batch = 1 if probe else max(need, 64) if filtered else need
        probe = False

        def read(
            tr: KVTransaction, s: bytes = start, e: bytes = stop, n: int = batch
        ) -> list[tuple[bytes, bytes]]:
            return tr.get_range(s, e, limit=n, snapshot=True)

        rows = run(q.kv, read)
        groups: list[_Row] = []
        jump: bytes | None = None
        for n, (key, value) in enumerate(rows):
            parts = q.keys.unpack(key)
            if len(parts) == 5 and groups and key.startswith(groups[-1][2]):
                groups[-1][4].append(value)  # a chunk of the letter just before it
                continue
            if len(parts) != 4:
                start, wasted = after(key), wasted + 1  # a chunk whose letter is gone
                continue
            zone, letter_id = ZoneId(str(parts[1]), str(parts[2])), str(parts[3])
            # Past this letter and its chunks (those cut off by the read's limit too: a
            # cut letter is read again whole below).
            start = after(key)
            jump = _jump(q, zone, letter_id, tenant, item_id)
            if jump is not None:
                last, start, probe = key, jump, True
                wasted += len(rows) - n
                break
            if jumping and stop == end:
                # In a matching range now: read to its end only (one tenant's letters,
                # or one letter), then jump on from there.
                stop = q.keys.dead_letters_zone_range(zone)[1] if item_id is None else (
                    q.keys.dead_letter_range_of(zone, letter_id)[1])  # fmt: skip
            groups.append((zone, letter_id, key, value, []))
        for zone, letter_id, key, value, chunks in groups:
            last = key
            letter = _decode(q, zone, letter_id, key, value, chunks)
            if letter is None:
                continue  # requeued or purged meanwhile
            if job_type is not None and (letter.item is None or letter.item.job_type != job_type):
                wasted += 1 + len(chunks)
                continue
            shown.append((key, letter))
            if len(shown) > limit:
                more_at = shown[limit - 1][0]
                return Page([x for _, x in shown[:limit]], encode_cursor(base, more_at))
        if jump is None and len(rows) < batch:
            if stop == end:
                return Page([x for _, x in shown], None)  # the end of the list
            start, stop, probe = max(start, stop), end, True  # past the matching range
        if wasted >= _SKIP and last is not None:
            return Page([x for _, x in shown], encode_cursor(base, last))


def iter_dead_letters(
    q: Quick,
    app: str | None = None,
    tenant: str | None = None,
    *,
    job_type: str | None = None,
    item_id: str | None = None,
) -> Iterator[DeadLetter]:
    """Every dead letter the filters select, a page at a time (bulk requeue and purge)."""
    cursor: str | None = None
    while True:
        page = dead_letter_page(q, app, tenant, job_type=job_type, item_id=item_id,
                                limit=_PAGE, cursor=cursor)  # fmt: skip
        yield from page.rows
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


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
    corrupt letter has no job type: a job-type filter leaves it out). Read a page at a
    time (:func:`dead_letter_page`): ``limit`` bounds what is read, not only what is
    returned."""
    if limit is None:
        return list(iter_dead_letters(q, app, tenant, job_type=job_type))
    out: list[DeadLetter] = []
    cursor: str | None = None
    while len(out) < limit:
        page = dead_letter_page(q, app, tenant, job_type=job_type,
                                limit=min(_PAGE, limit - len(out)), cursor=cursor)  # fmt: skip
        out.extend(page.rows)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return out


def count_dead_letters(q: Quick, app: str | None = None) -> int:
    """How many dead letters (of ``app``, or of every app): each app's counter kept with
    its letters (:func:`quickzones.store.dead_groups.total`), its backfill run to the end
    first where a store written before the counters left one to do (an admin figure:
    that reads the app's letters once, a step a transaction)."""
    count = 0
    for name in [app] if app is not None else dead_letter_apps(q):
        while not dead_groups.advance(q.kv, q.keys, name):
            pass
        count += dead_groups.total(q.kv, q.keys, name, steps=0).count
    return count


def count_dead_letters_online(
    q: Quick, wait: Callable[[float], bool], *, again_s: float = 60.0, step_keys: int = 200
) -> None:
    """Keep every app's dead-letter counters whole, until ``wait`` returns True
    (``threading.Event.wait``): run each unfinished backfill (a store written before the
    counters; ``step_keys`` keys a transaction: short, so a request beside it waits for
    no long step) to its end, calling ``wait(seconds)``
    after each step for as long as the step took (half the time at most, beside a
    server's requests); then look again every ``again_s`` (an app whose letters an older
    version began: one short read per app with letters)."""
    while True:
        for app in dead_letter_apps(q):
            while True:
                started = time.monotonic()
                if dead_groups.advance(q.kv, q.keys, app, max_keys=step_keys):
                    break
                if wait(time.monotonic() - started):
                    return
        if wait(again_s):
            return


def dead_letter_apps(q: Quick) -> list[str]:
    """The apps that have dead letters: one short read per app (it skips over each app's
    letters), so many letters cost no more than few."""
    apps: list[str] = []
    begin, end = q.keys.dead_letters_range()
    while True:

        def first(tr: KVTransaction, start: bytes = begin) -> list[tuple[bytes, bytes]]:
            return tr.get_range(start, end, limit=1, snapshot=True)

        rows = run(q.kv, first)
        if not rows:
            return apps
        apps.append(str(q.keys.unpack(rows[0][0])[1]))
        begin = q.keys.dead_letters_range(apps[-1])[1]


_ITEM_ARITY = 1  # a zone item page's cursor names an item id below the zone's items


def zone_item_page(
    q: Quick, zone: ZoneId, *, limit: int = 50, cursor: str | None = None
) -> tuple[int, Page[WorkItem]]:
    """One page of a zone's items (every state) in id order from ``cursor``, with the
    zone's item count (a counter kept with the items by atomic adds, not a scan). It
    reads the items it shows and the first key after them, however many the zone holds:
    a large item's payload chunks are passed over, not read (beyond what one read had
    already fetched)."""
    check_limit(limit)
    begin, end = q.keys.items_range(zone)
    base = begin[:-1]  # (root, "z", app, tenant, "i")
    start = begin
    if cursor is not None:
        start = after(decode_cursor(base, cursor, _ITEM_ARITY))
    shown: list[tuple[bytes, WorkItem]] = []
    probe = False  # after a large item: read one key, its chunks may follow
    while True:
        batch = 1 if probe else limit + 1 - len(shown)
        probe = False

        def read(tr: KVTransaction, s: bytes = start, n: int = batch) -> list[tuple[bytes, bytes]]:
            return tr.get_range(s, end, limit=n, snapshot=True)

        rows = run(q.kv, read)
        for key, value in rows:
            start = after(key)
            if len(q.keys.unpack(key)) != 5:
                continue  # a payload chunk (of an item cut off by the read's limit)
            try:
                item = decode_item(key, value)
            except CorruptRecord:
                continue
            shown.append((key, item))
            if len(shown) > limit:
                total = zone_count(q, zone)
                cut = encode_cursor(base, shown[limit - 1][0])
                return total, Page([x for _, x in shown[:limit]], cut)
            if "_chunks" in item.meta:
                probe = True  # its chunks come next: the next read starts past them
                break
        if not probe and len(rows) < batch:
            return zone_count(q, zone), Page([x for _, x in shown], None)


@dataclass(frozen=True, slots=True)
class KeyTurn:
    """Where an item stands with the one-at-a-time key it names: it holds ``key``
    (``holder`` None), or waits parked for the item ``holder``, which holds it."""

    key: str
    holder: str | None = None
    # The key's record does not decode: the holder is unknown (``holder`` is then
    # flow_keys.UNKNOWN_HOLDER for an item still in the key's line, None for one out of it).
    corrupt: bool = False


def key_turns(q: Quick, zone: ZoneId, items: Sequence[WorkItem]) -> dict[str, KeyTurn]:
    """The turn of each of ``items`` (a page of a zone's) that names a one-at-a-time key,
    by item id, as :func:`flow_keys.waits_for` decides it (the rule the key's release
    passes it by). One snapshot transaction; a key's record is read once or twice however
    many of its items the page shows (every read of it returns the same holder), and an
    item without a key costs nothing."""
    by_key: dict[str, list[WorkItem]] = {}
    for item in items:
        named = item.meta.get(flow_keys.FLOW_META)
        if named and named[0] == flow_keys.ONE_AT_A_TIME:
            by_key.setdefault(str(named[1]), []).append(item)

    def read(tr: KVTransaction) -> dict[str, KeyTurn]:
        turns: dict[str, KeyTurn] = {}
        for key, waiting in by_key.items():
            holder = None
            for item in waiting:  # None for the holder itself (or no readable record)
                holder = flow_keys.waits_for(tr, q.keys, zone, item)
                if holder is not None:
                    break
            if holder == flow_keys.UNKNOWN_HOLDER:
                # Behind a corrupt record only each item's own place in the line says
                # whether it waits: one more read an item, on this rare path only.
                for item in waiting:
                    own = flow_keys.waits_for(tr, q.keys, zone, item)
                    turns[item.item_id] = KeyTurn(key, own, corrupt=True)
                continue
            for item in waiting:
                turns[item.item_id] = KeyTurn(key, None if item.item_id == holder else holder)
        return turns

    return run(q.kv, read) if by_key else {}


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
    key = item.meta.get(flow_keys.FLOW_META)
    if key and key[0] == flow_keys.ONE_AT_A_TIME:
        # Back into its key's line, never beside the key's holder.
        item = replace(item, flow=flow_keys.FlowKey(flow_keys.ONE_AT_A_TIME, str(key[1])))
    return two_part.part_one(tr, q.toplevel, q.zones, zone, item).item_id


def _move_out(q: Quick, zone: ZoneId, item_id: str) -> str:
    """A dead letter of items kept outside the KV zones (``zones=sql``) back into their
    store, which cannot share the letter's transaction: the item enqueued first (its id
    refused while queued), then the letter removed. A crash in between leaves the letter
    beside the queued item (a later requeue keeps it and says so), never a lost item."""
    new = q.zones.dead_letter_item(zone, item_id)
    if q.items.get(zone, item_id) is not None:
        raise ItemAlreadyQueued(str(zone), item_id)
    requeued = q.items.enqueue(zone, new)
    q.zones.drop_dead_letter(zone, item_id)
    return requeued


def requeue_dead_letter(q: Quick, zone: ZoneId, item_id: str) -> str:
    """Put a dead letter back into its zone with a clean error count, in one transaction
    with the dead letter's removal: both happen or neither (where the items live in
    another store than the letters: :func:`_move_out`).

    :class:`~quickzones.errors.ItemAlreadyQueued` if the zone already holds an item with
    this id (the dead letter is kept); corrupt records cannot be requeued."""
    check_name("item_id", item_id)
    if q.items is not q.zones:
        requeued = _move_out(q, zone, item_id)
    else:
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

        done = _move_out_each(q, batch) if q.items is not q.zones else run(q.kv, move)
        result.requeued += done.requeued
        result.kept.extend(done.kept)
        result.gone += done.gone
        q.wake_waiters()
    return result


def _move_out_each(q: Quick, letters: list[DeadLetter]) -> Requeued:
    """:func:`_move_out` for each letter, as :func:`requeue` reports a batch."""
    done = Requeued()
    for letter in letters:
        try:
            _move_out(q, letter.zone, letter.item_id)
        except ItemAlreadyQueued:
            done.kept.append(letter)
        except (ItemNotFound, CorruptRecord):
            done.gone += 1
        else:
            done.requeued += 1
    return done


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
            # Only those still there leave their group's count (one purged meanwhile
            # was counted out by its own purge).
            there = get_many(tr, [q.keys.dead_letter_key(d.zone, d.item_id) for d in page])
            for letter, found in zip(page, there, strict=True):
                tr.clear_range(*q.keys.dead_letter_range_of(letter.zone, letter.item_id))
                if found is not None:
                    dead_groups.add(
                        tr, q.keys, letter.zone, letter.item_id, letter_group(letter), -1
                    )

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

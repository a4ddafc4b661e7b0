"""Consumer heartbeats (issue 31 point 6): each running consumer keeps one small record in
the store, so ``quick serve``'s workers page shows who is running, how busy, routed to
what, and which one holds the in-order scanner lease::

    (root, "m", "consumer", consumer_id) -> msgpack {host, pid, started, beat, ...}

A consumer rewrites its own record every few seconds (blind writes: no conflicts). A
record whose beat is older than :data:`STALE_BEATS` periods is shown stale; one older than
its ``expires`` is cleared by whichever consumer beats next, so records of consumers that
died expire on their own.

Beside its record a consumer keeps what it runs now (issue 45 point 4), rewritten with
it::

    (root, "m", "consumer-running", consumer_id) -> msgpack {running, more}

each running item's app, tenant, id, job type, attempt, since when and its lease's end,
the longest running first, at most :data:`RUNNING_MAX` of them (and
:data:`RUNNING_BYTES`, so a list of long names still fits a value), with a count of
those left out. A key of its own: the beats' expiry scans and the workers page read the
small records only. ``quick serve`` beats the same way for the items its pull leases
hold for remote workers. So the dashboard lists an app's running items from the live
consumers' lists alone (:func:`running_page`), at most consumers x :data:`RUNNING_MAX` of
them, and a started item costs no write of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, replace

import msgpack

from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.pages import Page, decode_cursor, encode_cursor
from quickzones.store.records import ZoneId
from quickzones.store.tuple_layer import fdbtuple

STALE_BEATS = 3  # beats missed before a consumer is shown stale
EXPIRE_AFTER_MS = 10 * 60_000  # a record not renewed for this long is cleared
_NAME = "consumer"
_RUNNING = "consumer-running"
RUNNING_MAX = 100  # running items a record lists at most
RUNNING_BYTES = 50_000  # and their encoded size at most (a value holds 100,000 bytes)


@dataclass(frozen=True, slots=True)
class RunningItem:
    """One item a consumer runs now (or ``quick serve`` holds for a remote worker)."""

    zone: ZoneId
    item_id: str
    job_type: str
    attempts: int
    since_ms: int  # its run started (a pull lease: the item was leased)
    lease_until_ms: int

    def lapsed(self, at_ms: int) -> bool:
        """Its lease ran out unrenewed (its holder stalled; it may still extend it)."""
        return self.lease_until_ms <= at_ms

    def _row(self) -> list[object]:
        z = self.zone
        return [z.app, z.tenant, self.item_id, self.job_type, self.attempts, self.since_ms,
                self.lease_until_ms]  # fmt: skip


def listed(running: Iterable[RunningItem]) -> tuple[tuple[RunningItem, ...], int]:
    """What a record lists of ``running``: the longest running first, within
    :data:`RUNNING_MAX` and :data:`RUNNING_BYTES`; and how many are left out."""
    ordered = sorted(running, key=lambda r: (r.since_ms, r.zone.tenant, r.item_id))
    kept: list[RunningItem] = []
    size = 0
    for r in ordered[:RUNNING_MAX]:
        size += len(msgpack.packb(r._row()))
        if size > RUNNING_BYTES:
            break
        kept.append(r)
    return tuple(kept), len(ordered) - len(kept)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    consumer_id: str
    host: str
    pid: int
    started_ms: int
    beat_ms: int
    interval_ms: int
    workers: int
    busy: int  # workers running a handler
    held: int  # items leased and not finished: running, or waiting for a worker
    apps: tuple[str, ...] | None  # routed to these apps; None: every app
    job_types: tuple[str, ...] | None
    scanner: tuple[str, ...]  # clusters whose in-order scanner lease it holds
    running: tuple[RunningItem, ...] = ()  # longest running first (:func:`listed`)
    running_more: int = 0  # running and left out of ``running``

    def stale(self, at_ms: int) -> bool:
        return at_ms - self.beat_ms > STALE_BEATS * self.interval_ms

    @property
    def expires_ms(self) -> int:
        return self.beat_ms + max(EXPIRE_AFTER_MS, STALE_BEATS * self.interval_ms)


def _encode(b: Heartbeat) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "host": b.host,
            "pid": b.pid,
            "started": b.started_ms,
            "beat": b.beat_ms,
            "interval": b.interval_ms,
            "workers": b.workers,
            "busy": b.busy,
            "held": b.held,
            "apps": None if b.apps is None else list(b.apps),
            "types": None if b.job_types is None else list(b.job_types),
            "scanner": list(b.scanner),
        }
    )
    return packed


def _encode_running(b: Heartbeat) -> bytes:
    packed: bytes = msgpack.packb(
        {"running": [r._row() for r in b.running], "more": b.running_more}
    )
    return packed


def _running(rows: list[list[object]]) -> tuple[RunningItem, ...]:
    return tuple(
        RunningItem(
            ZoneId(str(app), str(tenant)), str(item_id), str(job_type), int(str(attempts)),
            int(str(since)), int(str(until)),
        )
        for app, tenant, item_id, job_type, attempts, since, until in rows
    )  # fmt: skip


def _decode(consumer_id: str, raw: bytes) -> Heartbeat | None:
    """The record, or None where it is not one this version wrote (skipped, not fatal:
    it expires like any other)."""
    try:
        o = msgpack.unpackb(raw)
        return Heartbeat(
            consumer_id, str(o["host"]), int(o["pid"]), int(o["started"]), int(o["beat"]),
            int(o["interval"]), int(o["workers"]), int(o["busy"]),
            int(o["held"]),
            None if o["apps"] is None else tuple(map(str, o["apps"])),
            None if o["types"] is None else tuple(map(str, o["types"])),
            tuple(map(str, o["scanner"])),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, msgpack.ExtraData):
        return None


def beat(kv: KVStore, keys: KeySpace, record: Heartbeat, now_ms: int) -> None:
    """Write ``record`` and its running list, and clear every consumer's record past its
    expiry (its list too)."""

    def write(tr: KVTransaction) -> None:
        tr.set(keys.meta_key(_NAME, record.consumer_id), _encode(record))
        if record.running or record.running_more:
            tr.set(keys.meta_key(_RUNNING, record.consumer_id), _encode_running(record))
        else:
            tr.clear(keys.meta_key(_RUNNING, record.consumer_id))
        # A snapshot read: beats never conflict. A consumer that beats again just as its
        # expired record is cleared loses that one record, and writes it at its next beat.
        for key, raw in tr.get_range(*keys.meta_range(_NAME), limit=1000, snapshot=True):
            consumer_id = str(keys.unpack(key)[-1])
            other = _decode(consumer_id, raw)
            if other is None or other.expires_ms < now_ms:
                tr.clear(key)
                tr.clear(keys.meta_key(_RUNNING, consumer_id))

    run(kv, write)


def forget(kv: KVStore, keys: KeySpace, consumer_id: str) -> None:
    """Clear a consumer's record and running list (it stopped cleanly)."""

    def clear(tr: KVTransaction) -> None:
        tr.clear(keys.meta_key(_NAME, consumer_id))
        tr.clear(keys.meta_key(_RUNNING, consumer_id))

    run(kv, clear)


def heartbeats(kv: KVStore, keys: KeySpace, *, running: bool = False) -> list[Heartbeat]:
    """Every consumer's record, by consumer id; with ``running``, each with what it runs
    (a second range read, of the running lists)."""

    def read(tr: KVTransaction) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
        records = tr.get_range(*keys.meta_range(_NAME), limit=1000, snapshot=True)
        if not running:
            return records, []
        return records, tr.get_range(*keys.meta_range(_RUNNING), limit=1000, snapshot=True)

    records, lists = run(kv, read)
    runs = {str(keys.unpack(key)[-1]): raw for key, raw in lists}
    out = []
    for key, raw in records:
        consumer_id = str(keys.unpack(key)[-1])
        record = _decode(consumer_id, raw)
        if record is None:
            continue
        listed = runs.get(consumer_id)
        out.append(record if listed is None else _with_running(record, listed))
    return out


def _with_running(record: Heartbeat, raw: bytes) -> Heartbeat:
    """``record`` with the running list ``raw`` (none where it is not one this wrote)."""
    try:
        o = msgpack.unpackb(raw)
        return replace(record, running=_running(o["running"]), running_more=int(o["more"]))
    except (ValueError, TypeError, KeyError, msgpack.ExtraData):
        return record


def running_page(
    beats: Iterable[Heartbeat],
    app: str,
    now_ms: int,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[tuple[Heartbeat, RunningItem]]:
    """One page of ``app``'s running items listed by the live (not stale) records
    ``beats``, each with the record listing it, longest running first, from ``cursor``.
    An item two records list (its lease lapsed on one consumer and another took it) is
    shown with the newer run."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument("limit", limit, "must be a whole number of at least 1")
    start = b"" if cursor is None else decode_cursor(b"", cursor, 3)
    newest: dict[tuple[str, str], tuple[Heartbeat, RunningItem]] = {}
    for beat in beats:
        if beat.stale(now_ms):
            continue
        for r in beat.running:
            if r.zone.app != app:
                continue
            seen = newest.get((r.zone.tenant, r.item_id))
            if seen is None or seen[1].since_ms < r.since_ms:
                newest[(r.zone.tenant, r.item_id)] = (beat, r)
    ordered = sorted(((_order(r), (b, r)) for b, r in newest.values()), key=lambda x: x[0])
    keys = [key for key, _ in ordered]
    at = bisect.bisect_right(keys, start) if cursor is not None else 0
    shown = ordered[at : at + limit]
    more = at + limit < len(ordered)
    return Page([row for _, row in shown], encode_cursor(b"", shown[-1][0]) if more else None)


def running_now(
    beats: Iterable[Heartbeat], zone: ZoneId, item_id: str, now_ms: int
) -> tuple[Heartbeat, RunningItem] | None:
    """The run of one item that the live records ``beats`` list, with the record listing
    it (the newer run where two do, as :func:`running_page`); None where none lists it
    (not running, started since the last beat, or left out of a full list)."""
    found = [
        (b, r)
        for b in beats
        if not b.stale(now_ms)
        for r in b.running
        if r.zone == zone and r.item_id == item_id
    ]
    return max(found, key=lambda row: row[1].since_ms, default=None)


def _order(r: RunningItem) -> bytes:
    """A running item's place in a page (and its cursor): since when, tenant, id."""
    return bytes(fdbtuple.pack((r.since_ms, r.zone.tenant, r.item_id)))

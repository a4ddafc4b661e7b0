"""The running index (issue 45 point 4): each started run's entry, written with its lease,
so the dashboard lists what runs now, oldest first, without visiting a zone::

    (root, "m", "running", app, since_ms, tenant, item_id) -> msgpack {l, t, h}

``l`` is the lease id, ``t`` the job type, ``h`` who leased it: the process
(``host:pid``, :func:`holder`) that granted the lease, which the dashboard matches to a
consumer's heartbeat record. The entry is set in the transaction that starts the run (a
lease to start at once, or a held lease's start check) and cleared, by key, in the one
that ends it (complete, requeue, dead letter, cancel, a lapsed lease leased again): the
item's record keeps ``since_ms`` (``WorkItem.running_since_ms``) for that. Blind sets and
clears: they conflict with nothing.

An entry can outlive its run where the item left by a path that does not clear it (a
tenant move, an item store other than the KV one); a reader checks each entry against the
item's record and clears those whose item is gone or leased again (:func:`running_page`),
so what a page reads stays bounded by what it shows plus :data:`STALE_MAX`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache

import msgpack

from quickzones.errors import CorruptRecord, InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, get_many, run
from quickzones.store.pages import Page, decode_cursor, encode_cursor
from quickzones.store.records import WorkItem, ZoneId, decode_item

_NAME = "running"
_ARITY = 3  # a cursor names (since_ms, tenant, item_id) below (root, "m", "running", app)
# Entries a page passes over (stale, cleared as it goes) before it ends short with a
# cursor: a page's reads stay bounded however many runs ended uncleared.
STALE_MAX = 500


@cache
def _host() -> str:
    return socket.gethostname()


def holder() -> str:
    """Who grants a lease here: ``host:pid`` (the pid read at each call, so a forked
    consumer process names itself, not its parent)."""
    return f"{_host()}:{os.getpid()}"


def entry_key(keys: KeySpace, zone: ZoneId, item_id: str, since_ms: int) -> bytes:
    # (root, "m", "running", app, since_ms, tenant, item_id)
    return keys.meta_key(_NAME, zone.app, since_ms, zone.tenant, item_id)


def mark(tr: KVTransaction, keys: KeySpace, zone: ZoneId, item: WorkItem) -> None:
    """Add ``item``'s started run (``item.running_since_ms`` set) to the index, in ``tr``."""
    if item.running_since_ms is None or item.lease_id is None:
        return
    value = msgpack.packb({"l": item.lease_id, "t": item.job_type, "h": holder()})
    tr.set(entry_key(keys, zone, item.item_id, item.running_since_ms), value)


def unmark(tr: KVTransaction, keys: KeySpace, zone: ZoneId, item: WorkItem) -> None:
    """Clear the entry of ``item``'s run, if it had one (a blind clear), in ``tr``."""
    if item.running_since_ms is not None:
        tr.clear(entry_key(keys, zone, item.item_id, item.running_since_ms))


@dataclass(frozen=True, slots=True)
class Running:
    """One running item as a page shows it. ``lapsed``: its lease ran out unreleased and
    nobody leased it since (its holder stopped or stalled; it may still extend it)."""

    zone: ZoneId
    item_id: str
    job_type: str
    since_ms: int
    holder: str
    attempts: int
    lease_until_ms: int
    lapsed: bool


def _decode_entry(raw: bytes) -> tuple[str, str, str] | None:
    try:
        o = msgpack.unpackb(raw)
        return str(o["l"]), str(o["t"]), str(o["h"])
    except (ValueError, TypeError, KeyError, msgpack.ExtraData):
        return None


def running_page(
    kv: KVStore,
    keys: KeySpace,
    app: str,
    now_ms: int,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> Page[Running]:
    """One page of ``app``'s running items, longest running first, from ``cursor``. Each
    entry is checked against its item's record (one batched read per page); entries whose
    item is gone or leased again since are cleared (blind clears, their own transaction)
    and passed over, at most :data:`STALE_MAX` a page: a page may end short with a
    cursor. Snapshot reads: no conflict with producers or consumers."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument("limit", limit, "must be a whole number of at least 1")
    begin, end = keys.meta_range(_NAME, app)
    base = begin[:-1]
    start = begin
    if cursor is not None:
        start = decode_cursor(base, cursor, _ARITY) + b"\x00"
    shown: list[tuple[bytes, Running]] = []
    passed = 0
    while True:
        batch = limit + 1 - len(shown)

        def read(
            tr: KVTransaction, s: bytes = start, n: int = batch
        ) -> tuple[list[tuple[bytes, bytes]], list[bytes | None]]:
            rows = tr.get_range(s, end, limit=n, snapshot=True)
            zones = [_entry_zone(keys, key) for key, _ in rows]
            items = get_many(tr, [keys.item_key(z, i) for z, i, _ in zones])
            return rows, items

        rows, records = run(kv, read)
        stale: list[bytes] = []
        for (key, raw), record in zip(rows, records, strict=True):
            start = key + b"\x00"
            zone, item_id, since = _entry_zone(keys, key)
            found = _check(keys, zone, item_id, since, raw, record, now_ms)
            if found is None:
                stale.append(key)
                continue
            shown.append((key, found))
            if len(shown) > limit:
                _clear(kv, stale)
                return Page([r for _, r in shown[:limit]], encode_cursor(base, shown[limit - 1][0]))
        _clear(kv, stale)
        passed += len(stale)
        if len(rows) < batch:
            return Page([r for _, r in shown], None)
        if passed >= STALE_MAX:
            return Page([r for _, r in shown], encode_cursor(base, rows[-1][0]))


def _entry_zone(keys: KeySpace, key: bytes) -> tuple[ZoneId, str, int]:
    *_, app, since, tenant, item_id = keys.unpack(key)
    return ZoneId(str(app), str(tenant)), str(item_id), int(str(since))


def _check(
    keys: KeySpace,
    zone: ZoneId,
    item_id: str,
    since: int,
    raw: bytes,
    record: bytes | None,
    now_ms: int,
) -> Running | None:
    """The entry as shown, or None when its run is over: its item gone, leased again or
    released (another lease id, or none), or the entry unreadable."""
    entry = _decode_entry(raw)
    if entry is None or record is None:
        return None
    lease_id, job_type, who = entry
    try:
        item = decode_item(keys.item_key(zone, item_id), record)
    except CorruptRecord:
        return None
    if item.lease_id != lease_id or item.running_since_ms != since:
        return None
    return Running(
        zone, item_id, job_type, since, who, item.attempts, item.vesting_ms,
        lapsed=item.vesting_ms <= now_ms,
    )  # fmt: skip


def _clear(kv: KVStore, stale: list[bytes]) -> None:
    """Clear entries found stale: blind clears. An entry is keyed by its run's start, and
    a lease id never comes back, so a stale entry never turns live again."""
    if not stale:
        return

    def clear(tr: KVTransaction) -> None:
        for key in stale:
            tr.clear(key)

    run(kv, clear)

"""Flow keys (issue 45 point 1): idempotency keys and debounce keys of one (app, tenant).

    (root, "k", app, tenant, kind, key)                  -> key record (msgpack)
    (root, "ke", expires_ms, app, tenant, kind, key)     -> b""  (expiry of a TTL hold)

``kind`` is "i" (idempotency) or "d" (debounce). A record names the item holding the key.
It is written by the enqueue's part one, in the enqueuing transaction (the caller's own,
with ``tr`` or ``enqueue_on``), after a read of the record that conflicts: of two
enqueues of one key racing, one commits and the other retries and sees it. It is
released by :func:`release`, which :func:`quickzones.store.outcomes.finished` calls in the
transaction that completes, cancels or dead-letters the item: a crash before that leaves
the key held by the unfinished item, and no finished item keeps holding it.

The records sit beside the tenant's zone, not inside its range ``(root, "z", app,
tenant)``: a key held for a TTL after its item finished must not keep the zone's pointer
alive (invariant 2 reads the whole zone range). Expired holds are collected from the start
of the expiry index with the outcome records, never by a scan of tenants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgpack

from quickzones.errors import CorruptRecord, InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVTransaction
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.validation import MAX_DELAY_S, check_name, check_seconds

IDEMPOTENCY = "i"
DEBOUNCE = "d"
# The item's metadata naming the key it holds: [kind, key, ttl_ms], so the finishing
# transaction releases it without a registry or a second lookup.
FLOW_META = "_k"
# What a duplicate enqueue of a key held by a live item reports (as an item id's does).
QUEUED = "queued"
# What an enqueue merged into a debounced item reports.
DEBOUNCED = "debounced"


@dataclass(frozen=True, slots=True)
class Debounce:
    """Keep one item per ``key`` of a tenant: each enqueue of the key replaces the queued
    item's payload, and the item vests once the key has been quiet ``wait_s`` seconds, or
    ``max_wait_s`` after the first of these enqueues, whichever comes first. An item
    already running is not touched: the next enqueue starts a new one."""

    key: str
    wait_s: float
    max_wait_s: float

    def __post_init__(self) -> None:
        check_name("debounce.key", self.key)
        wait = check_seconds("debounce.wait_s", self.wait_s)
        most = check_seconds("debounce.max_wait_s", self.max_wait_s)
        if most < wait:
            raise InvalidArgument(
                "debounce.max_wait_s", self.max_wait_s, f"must be at least wait_s ({wait:g})"
            )


@dataclass(frozen=True, slots=True)
class FlowKey:
    """The key an enqueue names, as the zone store gets it (:class:`NewItem.flow`)."""

    kind: str
    key: str
    ttl_ms: int = 0  # idempotency: how long the key stays held after its item finished
    wait_ms: int = 0  # debounce
    max_wait_ms: int = 0

    def meta(self) -> dict[str, Any]:
        return {FLOW_META: [self.kind, self.key, self.ttl_ms]}


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """Who holds a key: a live item (``until_ms`` 0), or a finished one until
    ``until_ms`` (its final ``state``). ``first_ms``: when a debounced item's first
    enqueue came."""

    item_id: str
    first_ms: int
    until_ms: int = 0
    state: str | None = None


def flow_key(
    idempotency_key: object,
    idempotency_ttl_s: object,
    debounce: object,
    *,
    item_id: str | None,
    delayed: bool,
    after: object,
) -> FlowKey | None:
    """The enqueue's options checked and combined, or None when it names no key.
    :class:`InvalidArgument` names the option at fault."""
    if idempotency_ttl_s is not None and idempotency_key is None:
        raise InvalidArgument("idempotency_ttl_s", idempotency_ttl_s, "needs idempotency_key")
    if debounce is not None:
        if not isinstance(debounce, Debounce):
            raise InvalidArgument(
                "debounce", debounce, "must be a Debounce(key, wait_s, max_wait_s)"
            )
        clash = (
            "cannot be combined with idempotency_key (a debounced key keeps one item already)"
            if idempotency_key is not None
            else "cannot be combined with item_id (the item keeps the first enqueue's id)"
            if item_id is not None
            else "sets the vesting time itself (wait_s): leave delay and run_at out"
            if delayed
            else "cannot be combined with after"
            if after is not None
            else None
        )
        if clash is not None:
            raise InvalidArgument("debounce", debounce, clash)
        return FlowKey(
            DEBOUNCE,
            debounce.key,
            wait_ms=math.ceil(debounce.wait_s * 1000),
            max_wait_ms=math.ceil(debounce.max_wait_s * 1000),
        )
    if idempotency_key is None:
        return None
    key = check_name("idempotency_key", idempotency_key)
    ttl = 0.0
    if idempotency_ttl_s is not None:
        ttl = check_seconds("idempotency_ttl_s", idempotency_ttl_s, maximum=MAX_DELAY_S)
    if after is not None:
        raise InvalidArgument("after", after, "cannot be combined with idempotency_key")
    return FlowKey(IDEMPOTENCY, key, ttl_ms=math.ceil(ttl * 1000))


def _encode(record: KeyRecord) -> bytes:
    out: bytes = msgpack.packb(
        {
            "v": 1,
            "id": record.item_id,
            "f": record.first_ms,
            "u": record.until_ms,
            "st": record.state,
        },
        use_bin_type=True,
    )
    return out


def _decode(key: bytes, raw: bytes) -> KeyRecord:
    try:
        d = msgpack.unpackb(raw, raw=False)
        return KeyRecord(str(d["id"]), int(d["f"]), int(d["u"]), d.get("st"))
    except Exception as err:  # msgpack and a missing field raise unrelated types
        raise CorruptRecord(key, f"flow key record: {err}") from err


def holder(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, flow: FlowKey, now_ms: int
) -> KeyRecord | None:
    """Who holds the key, read in ``tr`` with a conflict (a racing enqueue or release of
    it makes one of the two retry); None when free, or held by a TTL that ran out. A
    corrupt record holds nothing: the enqueue overwrites it."""
    key = keys.flow_key(zone, flow.kind, flow.key)
    raw = tr.get(key)
    if raw is None:
        return None
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        return None
    if record.until_ms and record.until_ms <= now_ms:
        return None
    return record


def hold(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, flow: FlowKey, item_id: str, first_ms: int
) -> None:
    """Make ``item_id`` the key's holder, in ``tr`` (the transaction that wrote it)."""
    tr.set(keys.flow_key(zone, flow.kind, flow.key), _encode(KeyRecord(item_id, first_ms)))


def release(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    item: WorkItem,
    state: str,
    now_ms: int,
    *,
    run_ended: bool = False,
) -> None:
    """In the transaction finishing ``item``: free the key it holds, or keep it held by
    the finished item for the key's TTL. A snapshot read: only this item's finish can
    change a record naming it (its own record is read with a conflict there), and an
    enqueue racing the release read the record with a conflict, so it retries.

    An at-most-once item is "completed" when taken, before it runs: the key stays held
    until its run ended (``run_ended``, the outcome written after the run)."""
    raw_meta = item.meta.get(FLOW_META)
    if not raw_meta:
        return
    if item.delivery == "at_most_once" and state == "completed" and not run_ended:
        return
    kind, name, ttl_ms = str(raw_meta[0]), str(raw_meta[1]), int(raw_meta[2])
    key = keys.flow_key(zone, kind, name)
    raw = tr.get(key, snapshot=True)
    if raw is None:
        return
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        record = None
    if record is not None and record.item_id != item.item_id:
        return  # another item holds it now (this one ran again from a dead letter)
    if ttl_ms <= 0 or kind != IDEMPOTENCY:
        tr.clear(key)
        return
    until = now_ms + ttl_ms
    first = now_ms if record is None else record.first_ms
    tr.set(key, _encode(KeyRecord(item.item_id, first, until, state)))
    tr.set(keys.flow_expiry_key(until, zone, kind, name), b"")


def collect_expired(tr: KVTransaction, keys: KeySpace, now_ms: int, limit: int) -> int:
    """Clear up to ``limit`` TTL holds expired by ``now_ms`` from the start of the expiry
    index, in ``tr``; returns how many index entries it cleared. A key held again since
    (a live item, or a later TTL) keeps its record: only the stale entry goes."""
    begin, end = keys.flow_expiry_range(now_ms)
    rows = tr.get_range(begin, end, limit=limit)
    for index_key, _ in rows:
        expires, zone, kind, name = keys.unpack_flow_expiry_key(index_key)
        key = keys.flow_key(zone, kind, name)
        raw = tr.get(key)
        if raw is not None:
            try:
                record = _decode(key, raw)
                stale = record.until_ms != 0 and record.until_ms <= expires
            except CorruptRecord:
                stale = True
            if stale:
                tr.clear(key)
        tr.clear(index_key)
    return len(rows)

"""Flow keys (issue 45 point 1): idempotency, debounce and one-at-a-time keys of one
(app, tenant).

    (root, "k", app, tenant, kind, key)                  -> key record (msgpack)
    (root, "k", app, tenant, "w", key, seq)              -> item_id (one-at-a-time: waiting)
    (root, "ke", expires_ms, app, tenant, kind, key)     -> b""  (expiry of a TTL hold, or
                                                                of an at-most-once run's)

``kind`` is "i" (idempotency), "d" (debounce) or "s" (one at a time). A record names the
item holding the key.
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

One at a time: the enqueue that finds its key held *parks* the item: its record and count
are written (it is in the zone: the zone is not empty, its status is queued) but no order
entry, so no visit or pull lease reads it, and a wait entry is written under the key at
the record's next sequence number: enqueue order, whatever the items' priorities or
vesting times. The key's holder keeps it through retries, backoff and a lapsed lease (it
stays the same item); the transaction that finishes it (:func:`release`) gives the key to
the first waiting item and the zone store writes that item's order entry in the same
transaction, at its own vesting time, and pulls the zone's pointer to it (the enqueue's
pointer check): the next item is visible at once, nothing spins, and an item without a
key costs nothing.

An at-most-once holder's run holds its one-at-a-time key for the run's lease
(:func:`hold_run`, ``lease_until_ms``), and a one-at-a-time record that does not decode is
held by an unknown holder (:func:`holder`): never free, or a second item of the key would
start beside the first. How such holds end without a finish (a killed run's lapse, a
corrupt record's repair, a TTL's expiry): :mod:`quickzones.store.flow_key_lapses`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from quickzones.errors import CorruptRecord, InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVTransaction
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.validation import MAX_DELAY_S, check_name, check_seconds

log = logging.getLogger("quick.flow_keys")

IDEMPOTENCY = "i"
DEBOUNCE = "d"
ONE_AT_A_TIME = "s"
# The item's metadata naming the key it holds: [kind, key, ttl_ms] (one at a time:
# [kind, key, 0, seq], seq its wait entry's number, -1 when it took the key at once), so
# the finishing transaction releases it without a registry or a second lookup.
FLOW_META = "_k"
# What a duplicate enqueue of a key held by a live item reports (as an item id's does).
QUEUED = "queued"
# What an enqueue merged into a debounced item reports.
DEBOUNCED = "debounced"
# Who holds a one-at-a-time key whose record does not decode: unknown (no item id is empty).
UNKNOWN_HOLDER = ""


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

    def meta(self, seq: int = -1) -> dict[str, Any]:
        if self.kind == ONE_AT_A_TIME:
            return {FLOW_META: [self.kind, self.key, 0, seq]}
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
    next_seq: int = 0  # one at a time: the next waiting item's number
    # One at a time, held by an at-most-once item whose run started: when that run's
    # hold lapses unless renewed (0: the holder is an item in the zone, its own lease).
    lease_until_ms: int = 0
    corrupt: bool = False  # not stored: read from a record that does not decode


def flow_key(
    idempotency_key: object,
    idempotency_ttl_s: object,
    debounce: object,
    *,
    item_id: str | None,
    delayed: bool,
    after: object,
    one_at_a_time: object = None,
) -> FlowKey | None:
    """The enqueue's options checked and combined, or None when it names no key.
    :class:`InvalidArgument` names the option at fault."""
    if one_at_a_time is not None:
        key = check_name("one_at_a_time", one_at_a_time)
        other = (
            "idempotency_key"
            if idempotency_key is not None
            else "debounce"
            if debounce is not None
            else "after"
            if after is not None
            else None
        )
        if other is not None:
            raise InvalidArgument(
                "one_at_a_time", one_at_a_time, f"cannot be combined with {other} (one key an item)"
            )
        return FlowKey(ONE_AT_A_TIME, key)
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


def encode_record(record: KeyRecord) -> bytes:
    out: bytes = msgpack.packb(
        {
            "v": 1,
            "id": record.item_id,
            "f": record.first_ms,
            "u": record.until_ms,
            "st": record.state,
            "n": record.next_seq,
            "l": record.lease_until_ms,
        },
        use_bin_type=True,
    )
    return out


def decode_record(key: bytes, raw: bytes) -> KeyRecord:
    """A key record as stored at ``key``; :class:`CorruptRecord` when unreadable."""
    return _decode(key, raw)


def _decode(key: bytes, raw: bytes) -> KeyRecord:
    try:
        d = msgpack.unpackb(raw, raw=False)
        return KeyRecord(
            str(d["id"]),
            int(d["f"]),
            int(d["u"]),
            d.get("st"),
            int(d.get("n", 0)),
            int(d.get("l", 0)),
        )
    except Exception as err:  # msgpack and a missing field raise unrelated types
        raise CorruptRecord(key, f"flow key record: {err}") from err


def holder(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, flow: FlowKey, now_ms: int
) -> KeyRecord | None:
    """Who holds the key, read in ``tr`` with a conflict (a racing enqueue or release of
    it makes one of the two retry); None when free, or held by a TTL that ran out. A
    corrupt idempotency or debounce record holds nothing (the enqueue overwrites it); a
    corrupt one-at-a-time record is held by an unknown holder (``corrupt``), its line's
    next number read from the line."""
    key = keys.flow_key(zone, flow.kind, flow.key)
    raw = tr.get(key)
    if raw is None:
        return None
    try:
        record = _decode(key, raw)
    except CorruptRecord as err:
        if flow.kind != ONE_AT_A_TIME:
            return None
        _tell_corrupt(zone, flow.key, err)
        seq = line_end(tr, keys, zone, flow.key)
        return KeyRecord(UNKNOWN_HOLDER, 0, next_seq=seq, corrupt=True)
    if record.until_ms and record.until_ms <= now_ms:
        return None
    return record


# Keys whose corrupt record this process has logged (bounded: a flood of corrupt records
# logs again after this many, never grows memory).
_TOLD: set[tuple[ZoneId, str]] = set()
_TOLD_MAX = 10_000


def _tell_corrupt(zone: ZoneId, name: str, err: CorruptRecord) -> None:
    if (zone, name) in _TOLD:
        return
    if len(_TOLD) >= _TOLD_MAX:
        _TOLD.clear()
    _TOLD.add((zone, name))
    log.warning(
        "one-at-a-time key %r of zone %s: its record is corrupt (%s); the key is held by an "
        "unknown holder until the holder's next write repairs it or its hold lapses",
        name, zone, err,
    )  # fmt: skip


def line_end(tr: KVTransaction, keys: KeySpace, zone: ZoneId, name: str) -> int:
    """The number after the key's last waiting item (0 when none waits), read with a
    conflict: two enqueues parking behind a corrupt record (which neither rewrites) at
    once conflict here, so they never take one number."""
    begin, end = keys.flow_wait_range(zone, name)
    rows = tr.get_range(begin, end, limit=1, reverse=True)
    if not rows:
        return 0
    seq = keys.unpack(rows[0][0])[-1]
    assert isinstance(seq, int)
    return seq + 1


def hold(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, flow: FlowKey, item_id: str, first_ms: int
) -> None:
    """Make ``item_id`` the key's holder, in ``tr`` (the transaction that wrote it)."""
    tr.set(keys.flow_key(zone, flow.kind, flow.key), encode_record(KeyRecord(item_id, first_ms)))


def wait(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    flow: FlowKey,
    held: KeyRecord,
    item_id: str,
) -> None:
    """Queue ``item_id`` (just parked, its record written with ``flow.meta(held.next_seq)``)
    behind the key's holder ``held``, as read by :func:`holder` in ``tr``. A corrupt
    record is left as it is (its holder repairs it), a write conflict declared on it."""
    tr.set(keys.flow_wait_key(zone, flow.key, held.next_seq), item_id.encode())
    key = keys.flow_key(zone, flow.kind, flow.key)
    if held.corrupt:
        tr.add_write_conflict_key(key)
        return
    tr.set(key, encode_record(replace(held, next_seq=held.next_seq + 1)))


def waits_for(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item: WorkItem, *, snapshot: bool = True
) -> str | None:
    """The item holding the one-at-a-time key ``item`` waits for (parked, no visit can
    lease it), or None when ``item`` names no such key or holds it. The rule the release
    passes the key by (:func:`release`), and what ``quick explain`` reports. Behind a
    corrupt record, :data:`UNKNOWN_HOLDER`, for an item still in the key's line."""
    raw_meta = item.meta.get(FLOW_META)
    if not raw_meta or raw_meta[0] != ONE_AT_A_TIME:
        return None
    name = str(raw_meta[1])
    key = keys.flow_key(zone, ONE_AT_A_TIME, name)
    raw = tr.get(key, snapshot=snapshot)
    if raw is None:
        return None
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        # Only the line says: an item in it waits; one out of it took or was passed the key.
        seq = int(raw_meta[3]) if len(raw_meta) > 3 else -1
        if seq < 0:
            return None
        entry = tr.get(keys.flow_wait_key(zone, name, seq), snapshot=snapshot)
        return UNKNOWN_HOLDER if entry == item.item_id.encode() else None
    return None if record.item_id == item.item_id else record.item_id


def release(
    tr: KVTransaction,
    keys: KeySpace,
    zone: ZoneId,
    item: WorkItem,
    state: str,
    now_ms: int,
    *,
    run_ended: bool = False,
) -> str | None:
    """In the transaction finishing ``item``: free the key it holds, or keep it held by
    the finished item for the key's TTL. A snapshot read: only this item's finish can
    change a record naming it (its own record is read with a conflict there), and an
    enqueue racing the release read the record with a conflict, so it retries.

    A one-at-a-time key passes to its first waiting item, whose id is returned: the
    caller (the zone store) writes that item's order entry in ``tr``. Its record is read
    with a conflict: an enqueue parking an item behind this one wrote it, so of the two
    one retries and no item is left waiting behind a released key.

    An at-most-once item is "completed" when taken, before it runs: the key stays held
    until its run ended (``run_ended``, the outcome written after the run); a one-at-a-time
    key is held for the run's lease from then on (its item's lease as taken, renewed by
    :func:`extend_hold`), so a run that never ends lets it go."""
    raw_meta = item.meta.get(FLOW_META)
    if not raw_meta:
        return None
    kind, name, ttl_ms = str(raw_meta[0]), str(raw_meta[1]), int(raw_meta[2])
    if item.delivery == "at_most_once" and state == "completed" and not run_ended:
        if kind == ONE_AT_A_TIME:
            hold_run(tr, keys, zone, item.item_id, name, item.vesting_ms)
        return None
    if kind == ONE_AT_A_TIME:
        return _pass_turn(tr, keys, zone, item, name, int(raw_meta[3]))
    key = keys.flow_key(zone, kind, name)
    raw = tr.get(key, snapshot=True)
    if raw is None:
        return None
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        record = None
    if record is not None and record.item_id != item.item_id:
        return None  # another item holds it now (this one ran again from a dead letter)
    if ttl_ms <= 0 or kind != IDEMPOTENCY:
        tr.clear(key)
        return None
    until = now_ms + ttl_ms
    first = now_ms if record is None else record.first_ms
    tr.set(key, encode_record(KeyRecord(item.item_id, first, until, state)))
    tr.set(keys.flow_expiry_key(until, zone, kind, name), b"")
    return None


def _pass_turn(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item: WorkItem, name: str, seq: int
) -> str | None:
    """:func:`release` of a one-at-a-time key: the next waiting item's id, or None."""
    if waits_for(tr, keys, zone, item, snapshot=False) is not None:
        # Finished while waiting (cancelled): it leaves the line, the holder keeps the key.
        if seq >= 0:
            tr.clear(keys.flow_wait_key(zone, name, seq))
        return None
    key = keys.flow_key(zone, ONE_AT_A_TIME, name)
    raw = tr.get(key)
    if raw is None:
        return None
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        # Its holder finishing (it is out of the line): the record is written anew.
        log.warning(
            "one-at-a-time key %r of zone %s: corrupt record repaired by its holder %s",
            name, zone, item.item_id,
        )  # fmt: skip
        record = KeyRecord(item.item_id, 0, next_seq=line_end(tr, keys, zone, name))
    else:
        if record.item_id != item.item_id:
            return None  # its hold lapsed and the key passed on: nothing of its to release
    return pass_on(tr, keys, zone, name, record)


def pass_on(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, name: str, record: KeyRecord
) -> str | None:
    """Give the one-at-a-time key ``name``, held as ``record`` says by an item that
    finished, to its first waiting item still in the zone, in ``tr``; returns that item's
    id (the caller writes its order entry), or None, the key freed, when none waits."""
    key = keys.flow_key(zone, ONE_AT_A_TIME, name)
    begin, end = keys.flow_wait_range(zone, name)
    while True:
        rows = tr.get_range(begin, end, limit=1)
        if not rows:
            tr.clear(key)
            return None
        wait_key, raw_id = rows[0]
        tr.clear(wait_key)
        begin = wait_key + b"\x00"
        next_id = raw_id.decode()
        if tr.get(keys.item_key(zone, next_id)) is None:
            continue  # gone without leaving the line (not expected): the next one
        passed = replace(record, item_id=next_id, lease_until_ms=0, corrupt=False)
        tr.set(key, encode_record(passed))
        return next_id


def hold_run(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item_id: str, name: str, until_ms: int
) -> bool:
    """The at-most-once holder ``item_id``'s run holds its key until ``until_ms``, in
    ``tr`` (its take, or a renewal): the record rewritten, an expiry entry added (an older
    one goes stale). Read with a conflict: a maintenance passing the key on at once makes
    one of the two retry. False when another item holds the key now (the hold lapsed)."""
    key = keys.flow_key(zone, ONE_AT_A_TIME, name)
    raw = tr.get(key)
    if raw is None:
        return False
    try:
        record = _decode(key, raw)
    except CorruptRecord:
        # A taken item of the key was leased, so it holds the key: it names itself again.
        log.warning(
            "one-at-a-time key %r of zone %s: corrupt record repaired by its holder %s",
            name, zone, item_id,
        )  # fmt: skip
        record = KeyRecord(item_id, 0, next_seq=line_end(tr, keys, zone, name))
    if record.item_id != item_id:
        return False
    tr.set(key, encode_record(replace(record, lease_until_ms=until_ms)))
    tr.set(keys.flow_expiry_key(until_ms, zone, ONE_AT_A_TIME, name), b"")
    return True

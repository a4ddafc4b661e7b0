"""Flow key holds that end without their item's finish (issue 45 point 1, review edges
1 and 2; :mod:`quickzones.store.flow_keys` holds and releases keys as items finish).

- A TTL hold (an idempotency key kept after its item finished) has an entry in the expiry
  index ``(root, "ke", expires_ms, app, tenant, kind, key)``; :func:`collect_expired`
  clears it, with the outcome records, reading only what expired.
- An at-most-once holder of a one-at-a-time key is deleted when its handler starts, so
  no item lease tells whether it still runs: its take writes the run's lease into the key
  record (:func:`flow_keys.hold_run`), its consumer's lease extender renews it
  (:func:`extend_hold`), and the end of its run releases the key. A run that never ends
  (its process killed) stops renewing; once the hold lapses, :func:`collect_expired`
  passes the key to the next waiting item, made visible by the zone store
  (:class:`TakesTurns`). The killed item is not run again: at most once holds.
- A one-at-a-time record that does not decode is held by an unknown holder
  (:func:`flow_keys.holder`); a holder's next write repairs it. When a run's hold lapses
  on one, :func:`collect_expired` looks in the zone for the key's item outside its line
  (an at-least-once holder, which finishes in time) and names it, or passes the key on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from quickzones.errors import CorruptRecord
from quickzones.store import flow_keys
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVTransaction
from quickzones.store.records import WorkItem, ZoneId, decode_item

log = logging.getLogger("quick.flow_keys")

# What makes the next item visible when the maintenance passes a lapsed key on (the zone
# store's order entry and pointer pull, in the same transaction).
TakeTurn = Callable[[KVTransaction, ZoneId, str], None]


@runtime_checkable
class TakesTurns(Protocol):
    """A zone store that makes an item a one-at-a-time key passed to visible (KV zones)."""

    def take_turn(self, tr: KVTransaction, zone: ZoneId, item_id: str | None) -> None: ...


@runtime_checkable
class HoldsRuns(Protocol):
    """A zone store whose at-most-once runs hold one-at-a-time keys (KV zones)."""

    def extend_key_hold(self, zone: ZoneId, item: WorkItem, lease_ms: int) -> int: ...


def turn_taker(zones: object) -> TakeTurn | None:
    """``zones``' :meth:`TakesTurns.take_turn`, or None for a store without flow keys."""
    return zones.take_turn if isinstance(zones, TakesTurns) else None


def extend_hold(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item: WorkItem, until_ms: int
) -> bool:
    """Renew the hold of a running at-most-once item (taken: deleted as it started) on
    its one-at-a-time key until ``until_ms``, in ``tr``; False when the hold lapsed and
    the key passed on (the run is then no longer the key's only one). True for an item
    that holds no such key: nothing to renew."""
    raw_meta = item.meta.get(flow_keys.FLOW_META)
    if not raw_meta or raw_meta[0] != flow_keys.ONE_AT_A_TIME:
        return True
    return flow_keys.hold_run(tr, keys, zone, item.item_id, str(raw_meta[1]), until_ms)


def holds_run_lease(item: WorkItem) -> bool:
    """Whether ``item``, taken as an at-most-once item, holds a key for its run's lease
    (:func:`extend_hold` renews it)."""
    raw_meta = item.meta.get(flow_keys.FLOW_META)
    if item.delivery != "at_most_once" or not raw_meta:
        return False
    return bool(raw_meta[0] == flow_keys.ONE_AT_A_TIME)


def collect_expired(
    tr: KVTransaction, keys: KeySpace, now_ms: int, limit: int, take_turn: TakeTurn | None
) -> int:
    """Clear up to ``limit`` TTL holds expired by ``now_ms`` from the start of the expiry
    index, in ``tr``; returns how many index entries it cleared. A key held again since
    (a live item, or a later TTL) keeps its record: only the stale entry goes. A lapsed
    at-most-once run's one-at-a-time key passes to its next waiting item, which
    ``take_turn`` (the zone store's) makes visible in ``tr``; without one (a store whose
    zones live elsewhere, which has no such keys) those entries are left."""
    begin, end = keys.flow_expiry_range(now_ms)
    rows = tr.get_range(begin, end, limit=limit)
    left = 0
    for index_key, _ in rows:
        expires, zone, kind, name = keys.unpack_flow_expiry_key(index_key)
        if kind == flow_keys.ONE_AT_A_TIME:
            if take_turn is None:
                left += 1
                continue
            tr.clear(index_key)
            turn = _run_lapsed(tr, keys, zone, name, expires)
            if turn is not None:
                take_turn(tr, zone, turn)
            continue
        tr.clear(index_key)
        key = keys.flow_key(zone, kind, name)
        raw = tr.get(key)
        if raw is not None:
            try:
                record = flow_keys.decode_record(key, raw)
                stale = record.until_ms != 0 and record.until_ms <= expires
            except CorruptRecord:
                stale = True
            if stale:
                tr.clear(key)
    return len(rows) - left


def _run_lapsed(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, name: str, expires: int
) -> str | None:
    """An at-most-once run's hold on ``name`` that lapsed at ``expires``: the key passed
    to its next waiting item (returned), unless renewed or passed on since (a stale
    entry). A corrupt record: named again for the holder found in the zone (an item of
    the key outside its line), or passed on when none is there."""
    key = keys.flow_key(zone, flow_keys.ONE_AT_A_TIME, name)
    raw = tr.get(key)
    if raw is None:
        return None
    try:
        record = flow_keys.decode_record(key, raw)
    except CorruptRecord:
        found = _holder_in_zone(tr, keys, zone, name)
        seq = flow_keys.line_end(tr, keys, zone, name)
        record = flow_keys.KeyRecord(found or flow_keys.UNKNOWN_HOLDER, 0, next_seq=seq)
        log.warning(
            "one-at-a-time key %r of zone %s: corrupt record repaired (%s)",
            name, zone, f"held by {found}" if found else "no holder left: passed on",
        )  # fmt: skip
        if found is not None:
            tr.set(key, flow_keys.encode_record(record))
            return None
        return flow_keys.pass_on(tr, keys, zone, name, record)
    if record.lease_until_ms == 0 or record.lease_until_ms > expires:
        return None  # renewed, ended or passed on since
    log.info(
        "one-at-a-time key %r of zone %s: the run of at-most-once item %s never ended "
        "(its hold lapsed); the key passes on",
        name, zone, record.item_id,
    )  # fmt: skip
    return flow_keys.pass_on(tr, keys, zone, name, record)


def _holder_in_zone(tr: KVTransaction, keys: KeySpace, zone: ZoneId, name: str) -> str | None:
    """The zone's item of the one-at-a-time key ``name`` that is not in its line: the
    key's holder (it took the key or was passed it). Reads the tenant's items (snapshot):
    only for a corrupt record, whose holder is named nowhere else."""
    begin, end = keys.items_range(zone)
    while True:
        rows = tr.get_range(begin, end, limit=_PAGE, snapshot=True)
        for item_key, raw in rows:
            begin = item_key + b"\x00"
            if len(keys.unpack(item_key)) != 5:  # (z, app, tenant, "i", id): not a chunk
                continue
            try:
                item = decode_item(item_key, raw)
            except CorruptRecord:
                continue  # a corrupt item: the visit that meets it sets it aside
            meta = item.meta.get(flow_keys.FLOW_META)
            if not meta or meta[0] != flow_keys.ONE_AT_A_TIME or str(meta[1]) != name:
                continue
            seq = int(meta[3]) if len(meta) > 3 else -1
            waiting = (
                seq >= 0
                and tr.get(keys.flow_wait_key(zone, name, seq), snapshot=True)
                == item.item_id.encode()
            )
            if not waiting:
                return item.item_id
        if len(rows) < _PAGE:
            return None


_PAGE = 1000

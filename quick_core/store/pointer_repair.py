"""Pointer records that cannot be decoded (issue 27, 1.5): set aside, reported, rebuilt.

A pointer record whose bytes do not decode would make every visit to its zone fail, and
its index entry would keep enqueues from making another: the zone would starve. The pointer
lease that meets one (``TopLevelQueue.lease_pointer``) calls :func:`set_aside`, which in a
transaction of its own keeps the bytes for an operator, logs a warning, and rebuilds the
pointer for the zone whose index entry names it, vesting now; that lease fails with reason
"corrupt" and the next scan leases the rebuilt pointer. Set-aside records:

    (root, "m", "bad_pointer", cluster, shard, pointer_id) -> {raw, zone, at, why}

``quickzones.store.admin`` counts (``stats().corrupt_pointers``) and lists them
(``set_aside_pointers``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack

from quickzones.clock import now_ms
from quickzones.errors import CorruptRecord
from quickzones.store.keys import LOCAL_APP
from quickzones.store.kv import KVTransaction, key_after, run
from quickzones.store.records import Pointer, ZoneId, decode_pointer

if TYPE_CHECKING:
    from quickzones.store.toplevel import PointerRef, TopLevelQueue

log = logging.getLogger(__name__)

_PAGE = 1000


@dataclass(frozen=True, slots=True)
class SetAsidePointer:
    """A pointer record that could not be decoded, as set aside: where it was, its bytes,
    the zone it was rebuilt for (None: no index entry named it), when and why."""

    cluster: str
    shard: int
    pointer_id: str
    raw: bytes
    zone: ZoneId | None
    at_ms: int
    reason: str


def encode_set_aside(raw: bytes, zone: ZoneId | None, at_ms: int, reason: str) -> bytes:
    obj: dict[str, object] = {"raw": raw, "at": at_ms, "why": reason}
    if zone is not None:
        obj.update(a=zone.app, tn=zone.tenant)
    packed: bytes = msgpack.packb(obj)
    return packed


def decode_set_aside(cluster: str, shard: int, pointer_id: str, value: bytes) -> SetAsidePointer:
    obj = msgpack.unpackb(value)
    zone = ZoneId(str(obj["a"]), str(obj["tn"])) if "a" in obj else None
    return SetAsidePointer(
        cluster, shard, pointer_id, bytes(obj["raw"]), zone, int(obj["at"]), str(obj["why"])
    )


def set_aside(toplevel: TopLevelQueue, ref: PointerRef, reason: str) -> Pointer | None:
    """Set aside the undecodable pointer record ``ref`` names, in a transaction of its own,
    and rebuild it for the zone an index entry of its shard names (vesting now), or clear
    it when none does. A vesting entry that names no record at all is cleared. Logs a
    warning; returns the rebuilt pointer (None if none, or if the record was rewritten or
    removed meanwhile). Reads the record and the index entry found with conflicts."""
    shard, pointer_id = ref.shard, ref.pointer_id
    keys, cluster = toplevel.keys, toplevel.cluster
    key = keys.pointer_key(cluster, shard, pointer_id)
    vesting_key = keys.pointer_vesting_key(cluster, shard, ref.vesting_ms, pointer_id)

    def repair(tr: KVTransaction) -> tuple[bool, Pointer | None, ZoneId | None]:
        raw = tr.get(key)
        if raw is None:
            tr.clear(vesting_key)  # names nothing: scanners would peek it forever
            return False, None, None
        try:
            decode_pointer(key, raw)
            return False, None, None  # rewritten meanwhile: nothing to repair
        except CorruptRecord:
            pass
        now = now_ms(toplevel.clock)
        zone = _zone_named(tr, toplevel, shard, pointer_id)
        tr.set(
            keys.bad_pointer_key(cluster, shard, pointer_id),
            encode_set_aside(raw, zone, now, reason),
        )
        tr.clear(vesting_key)
        if zone is None:
            tr.clear(key)
            return True, None, None
        rebuilt = Pointer(pointer_id, zone, now, now, local=zone.app == LOCAL_APP)
        toplevel.write_pointer(tr, shard, rebuilt)
        return True, rebuilt, zone

    done, rebuilt, zone = run(toplevel.kv, repair)
    if done:
        outcome = f"rebuilt for zone {zone}" if zone is not None else "cleared (no zone names it)"
        log.warning(
            "pointer %s in shard %d of cluster %r could not be decoded (%s): set aside and %s",
            pointer_id, shard, cluster, reason, outcome,
        )
    return rebuilt


def _zone_named(
    tr: KVTransaction, toplevel: TopLevelQueue, shard: int, pointer_id: str
) -> ZoneId | None:
    """The zone whose index entry in ``shard`` names ``pointer_id``: a scan of the shard's
    index (snapshot), then a conflicting read of the entry found. Only for a record that
    cannot be decoded, which names its zone nowhere else."""
    keys, cluster = toplevel.keys, toplevel.cluster
    begin, end = keys.pointer_index_range(cluster, shard)
    wanted = pointer_id.encode()
    while True:
        rows = tr.get_range(begin, end, limit=_PAGE, snapshot=True)
        for key, value in rows:
            if value == wanted and tr.get(key) == wanted:
                return keys.unpack_pointer_index_key(cluster, shard, key)
        if len(rows) < _PAGE:
            return None
        begin = key_after(rows[-1][0])

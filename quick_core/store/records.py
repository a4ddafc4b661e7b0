"""Records stored by quick: work items and pointers, encoded with msgpack, never pickle.

Every record is a msgpack map with a format version ``v`` so later releases can read what
earlier ones wrote. Decoding failures raise :class:`CorruptRecord` with the key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from quickzones.errors import CorruptRecord

RECORD_VERSION = 1
STAMP_SIZE = 10  # a commit versionstamp: 8-byte commit version + 2-byte batch order


@dataclass(frozen=True, slots=True, order=True)
class ZoneId:
    """One queue zone: the work of one tenant of one app."""

    app: str
    tenant: str

    def __str__(self) -> str:
        return f"{self.app}/{self.tenant}"


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A deferred unit of work in a zone.

    ``vesting_ms`` is when the item may next be dequeued; a lease is held by moving it
    into the future and setting ``lease_id``.
    """

    item_id: str
    job_type: str
    payload: bytes
    priority: int
    vesting_ms: int
    enqueued_ms: int
    error_count: int = 0
    lease_id: str | None = None
    last_error: str | None = None
    content_type: str = "bytes"  # "bytes" or "json"
    deadline_ms: int | None = None  # TTL: not started by then -> dead letter
    delivery: str = "at_least_once"  # or "at_most_once"
    # Runs so far: handlers started (a lease counted at its grant, or a held one at its
    # start), less those that lapsed (a lapse replaces its count with the next run's; see
    # ZoneLeases._grant_lease) and those given back unstarted.
    attempts: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    lapses: int = 0  # leases that ran out unreleased: its consumer crashed or stalled
    # (versionstamp, seq) of a FIFO item never leased: where its order entry is. None once
    # the item is keyed by vesting time (delayed, leased, requeued, imported).
    commit_order: tuple[bytes, int] | None = None
    # Leased to wait (a timer's look-ahead, a consumer's look-ahead beyond its free
    # workers), not started: no run counted yet. The start check counts it (attempts + 1,
    # held False) before the handler runs; a held lease that lapses counts nothing.
    held: bool = False
    # Not stored: set on the item a lease grant returns, to the vesting time it had
    # before (its requested run time, a retry's backoff end, a lapsed lease's end), so a
    # pickup is counted from when the item vested, not from its enqueue (issue 41 point
    # 10). None on an item read from the store.
    vested_ms: int | None = field(default=None, compare=False)

    def with_(self, **changes: Any) -> WorkItem:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Pointer:
    """A pointer in a top-level queue to a possibly non-empty zone."""

    pointer_id: str
    zone: ZoneId
    vesting_ms: int
    last_active_ms: int
    lease_id: str | None = None
    local: bool = False
    # The consumer whose visit holds the lease (its name, as its heartbeat and slots
    # give it), written by the same write that leases it; None: not leased, or leased
    # before pointers recorded it.
    holder: str | None = None

    def with_vesting(self, vesting_ms: int) -> Pointer:
        return replace(self, vesting_ms=vesting_ms)


def _pack(obj: dict[str, Any], stamp: bytes | None = None) -> bytes:
    obj["v"] = RECORD_VERSION
    if stamp is not None:
        # Last, as a 10-byte bin: its bytes end the record, where set_versionstamped_value
        # can fill them in (see item_value_template).
        obj["cv"] = stamp
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(key: bytes, raw: bytes) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as err:  # msgpack raises several unrelated types
        raise CorruptRecord(key, f"not msgpack: {err}") from err
    if not isinstance(obj, dict) or obj.get("v") != RECORD_VERSION:
        raise CorruptRecord(key, "unknown record format")
    return obj


def encode_item(item: WorkItem, *, include_payload: bool = True) -> bytes:
    obj: dict[str, Any] = {
        "id": item.item_id,
        "t": item.job_type,
        "pr": item.priority,
        "vs": item.vesting_ms,
        "eq": item.enqueued_ms,
        "ec": item.error_count,
        "ct": item.content_type,
        "at": item.attempts,
    }
    if include_payload:
        obj["p"] = item.payload
    if item.lease_id is not None:
        obj["l"] = item.lease_id
    if item.last_error is not None:
        obj["le"] = item.last_error
    if item.deadline_ms is not None:
        obj["dl"] = item.deadline_ms
    if item.delivery != "at_least_once":
        obj["dv"] = item.delivery
    if item.meta:
        obj["m"] = item.meta
    if item.lapses:
        obj["lp"] = item.lapses
    if item.held:
        obj["hd"] = True
    if item.commit_order is None:
        return _pack(obj)
    stamp, obj["cq"] = item.commit_order
    return _pack(obj, stamp)


def item_value_template(item: WorkItem, *, include_payload: bool = True) -> bytes:
    """The record of a FIFO item whose commit versionstamp is not known yet, shaped for
    ``set_versionstamped_value``: the stamp's 10 bytes end the record, followed by their
    offset as a little-endian uint32."""
    if item.commit_order is None or len(item.commit_order[0]) != STAMP_SIZE:
        raise ValueError("a FIFO record template needs a 10-byte stamp placeholder")
    raw = encode_item(item, include_payload=include_payload)
    return raw + struct.pack("<I", len(raw) - STAMP_SIZE)


def decode_item(key: bytes, raw: bytes, payload: bytes | None = None) -> WorkItem:
    obj = _unpack(key, raw)
    try:
        meta = dict(obj.get("m", {}))
        # A chunked item's header has no payload; the zone store reads its chunks.
        default = b"" if "_chunks" in meta else None
        body = obj.get("p", default) if payload is None else payload
        if not isinstance(body, bytes):
            raise TypeError("payload is not bytes")
        return WorkItem(
            item_id=str(obj["id"]),
            job_type=str(obj["t"]),
            payload=body,
            priority=int(obj["pr"]),
            vesting_ms=int(obj["vs"]),
            enqueued_ms=int(obj["eq"]),
            error_count=int(obj["ec"]),
            lease_id=obj.get("l"),
            last_error=obj.get("le"),
            content_type=str(obj.get("ct", "bytes")),
            deadline_ms=obj.get("dl"),
            delivery=str(obj.get("dv", "at_least_once")),
            attempts=int(obj.get("at", 0)),
            lapses=int(obj.get("lp", 0)),
            meta=meta,
            held=bool(obj.get("hd", False)),
            commit_order=_commit_order(obj),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptRecord(key, f"bad item fields: {err}") from err


def _commit_order(obj: dict[str, Any]) -> tuple[bytes, int] | None:
    stamp = obj.get("cv")
    if stamp is None:
        return None
    if not isinstance(stamp, bytes) or len(stamp) != STAMP_SIZE:
        raise ValueError("commit versionstamp is not 10 bytes")
    return stamp, int(obj["cq"])


def encode_pointer(ptr: Pointer) -> bytes:
    obj: dict[str, Any] = {
        "id": ptr.pointer_id,
        "a": ptr.zone.app,
        "tn": ptr.zone.tenant,
        "vs": ptr.vesting_ms,
        "la": ptr.last_active_ms,
        "lo": ptr.local,
    }
    if ptr.lease_id is not None:
        obj["l"] = ptr.lease_id
        if ptr.holder is not None:
            obj["c"] = ptr.holder
    return _pack(obj)


def idle_pointer_head(record: bytes, pointer: Pointer) -> bytes | None:
    """The bytes of ``record`` (``encode_pointer(pointer)``, an idle pointer) before its
    vesting time, where that is a msgpack uint64 (``0xcf`` and 8 bytes, as every time
    after 1970-02-19 is): the map's header, its id, app and tenant, and the ``vs`` key.
    A stored record that starts with them is the same pointer, idle (a leased record's
    map has more entries); a store compares them at commit (``kv.EarlierIfLater``). None
    where the record is not laid out so."""
    if pointer.lease_id is not None:
        return None
    fields = ("id", pointer.pointer_id, "a", pointer.zone.app, "tn", pointer.zone.tenant, "vs")
    body = b"".join(msgpack.packb(f, use_bin_type=True) for f in fields)
    end = 1 + len(body)  # after a fixmap's one-byte header (fewer than 16 entries)
    if record[0] & 0xF0 != 0x80 or record[1:end] != body or record[end : end + 1] != b"\xcf":
        return None
    return record[:end]


# Pointer records decoded lately, by their bytes. An enqueue reads its zone's pointer
# record after each commit (part two's check), and a record changes only when a consumer
# leases, requeues or moves it: the same bytes are the same (frozen) pointer, decoded once.
# At most this many are kept (a few hundred kB), all dropped when full.
POINTERS_KEPT = 4096
_pointers: dict[bytes, Pointer] = {}


def decode_pointer(key: bytes, raw: bytes) -> Pointer:
    known = _pointers.get(raw) if type(raw) is bytes else None
    if known is not None:
        return known
    obj = _unpack(key, raw)
    try:
        pointer = Pointer(
            pointer_id=str(obj["id"]),
            zone=ZoneId(str(obj["a"]), str(obj["tn"])),
            vesting_ms=int(obj["vs"]),
            last_active_ms=int(obj["la"]),
            lease_id=obj.get("l"),
            local=bool(obj.get("lo", False)),
            holder=obj.get("c"),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptRecord(key, f"bad pointer fields: {err}") from err
    if type(raw) is bytes:
        if len(_pointers) >= POINTERS_KEPT:
            _pointers.clear()
        _pointers[raw] = pointer
    return pointer


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An item that will not be retried, with why; ``item`` is None if it was corrupt.

    ``traceback`` is the failing handler's (bounded) traceback when there was one.
    """

    zone: ZoneId
    item_id: str
    reason: str
    dead_at_ms: int
    item: WorkItem | None
    raw: bytes
    traceback: str | None = None


MAX_REASON = 2000
MAX_TRACEBACK = 16_000  # characters; the tail is kept: it names the exception


def encode_dead_letter(
    reason: str,
    dead_at_ms: int,
    raw_item: bytes | None,
    *,
    chunks: int = 0,
    traceback: str | None = None,
) -> bytes:
    """A dead letter's record. The item record ``raw_item`` is kept whole: inline, or (when
    ``raw_item`` is None) in ``chunks`` chunk keys after the record, like a large item's
    payload, so no value exceeds the KV value limit and nothing is truncated."""
    obj: dict[str, Any] = {"r": reason[:MAX_REASON], "at": dead_at_ms}
    if raw_item is not None:
        obj["raw"] = raw_item
    else:
        obj["rc"] = chunks
    if traceback is not None:
        obj["tb"] = traceback[-MAX_TRACEBACK:]
    return _pack(obj)


def dead_letter_chunks(key: bytes, raw: bytes) -> int:
    """How many chunk keys after the record hold the dead item's record (0: inline)."""
    obj = _unpack(key, raw)
    try:
        return int(obj.get("rc", 0))
    except (TypeError, ValueError) as err:
        raise CorruptRecord(key, f"bad dead letter: {err}") from err


def decode_dead_letter(
    key: bytes, raw: bytes, zone: ZoneId, item_id: str, chunks: list[bytes] | None = None
) -> DeadLetter:
    """``chunks``: the values of the record's chunk keys, in order, when it has them."""
    obj = _unpack(key, raw)
    try:
        if "rc" in obj:
            want = int(obj["rc"])
            got = chunks or []
            if len(got) != want:
                raise ValueError(f"expected {want} chunks of the dead item, found {len(got)}")
            raw_item = b"".join(got)
        else:
            raw_item = obj["raw"]
        if not isinstance(raw_item, bytes):
            raise TypeError("the dead item is not bytes")
        try:
            item: WorkItem | None = decode_item(key, raw_item)
        except CorruptRecord:
            item = None
        tb = obj.get("tb")
        return DeadLetter(
            zone,
            item_id,
            str(obj["r"]),
            int(obj["at"]),
            item,
            raw_item,
            None if tb is None else str(tb),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptRecord(key, f"bad dead letter: {err}") from err

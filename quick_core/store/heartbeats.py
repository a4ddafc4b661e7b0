"""Consumer heartbeats (issue 31 point 6): each running consumer keeps one small record in
the store, so ``quick serve``'s workers page shows who is running, how busy, routed to
what, and which one holds the in-order scanner lease::

    (root, "m", "consumer", consumer_id) -> msgpack {host, pid, started, beat, ...}

A consumer rewrites its own record every few seconds (blind writes: no conflicts). A
record whose beat is older than :data:`STALE_BEATS` periods is shown stale; one older than
its ``expires`` is cleared by whichever consumer beats next, so records of consumers that
died expire on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, run

STALE_BEATS = 3  # beats missed before a consumer is shown stale
EXPIRE_AFTER_MS = 10 * 60_000  # a record not renewed for this long is cleared
_NAME = "consumer"


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
    """Write ``record`` and clear every consumer's record past its expiry."""

    def write(tr: KVTransaction) -> None:
        tr.set(keys.meta_key(_NAME, record.consumer_id), _encode(record))
        # A snapshot read: beats never conflict. A consumer that beats again just as its
        # expired record is cleared loses that one record, and writes it at its next beat.
        for key, raw in tr.get_range(*keys.meta_range(_NAME), limit=1000, snapshot=True):
            other = _decode(str(keys.unpack(key)[-1]), raw)
            if other is None or other.expires_ms < now_ms:
                tr.clear(key)

    run(kv, write)


def forget(kv: KVStore, keys: KeySpace, consumer_id: str) -> None:
    """Clear a consumer's record (it stopped cleanly)."""

    def clear(tr: KVTransaction) -> None:
        tr.clear(keys.meta_key(_NAME, consumer_id))

    run(kv, clear)


def heartbeats(kv: KVStore, keys: KeySpace) -> list[Heartbeat]:
    """Every consumer's record, by consumer id."""

    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(*keys.meta_range(_NAME), limit=1000, snapshot=True)

    out = []
    for key, raw in run(kv, read):
        record = _decode(str(keys.unpack(key)[-1]), raw)
        if record is not None:
            out.append(record)
    return out

"""A one-transaction visit's first reads in one round trip, where the store can send
several at once (kv.read_ahead: PostgreSQL): every pointer record of the batch and, for a
zone visited before, what its dequeue reads first. Without it each is a round trip of its
own, one after another (the record, then the zone): a batch of four small zones made
eight before anything was leased. A pointer names its zone only in its record, so the
zones of the pointers leased lately are remembered here."""

from __future__ import annotations

from collections.abc import Sequence

from quickzones.consumer.state import Cluster
from quickzones.consumer.visit_rules import ZoneVisit
from quickzones.store.kv import KVTransaction, read_ahead, reads_ahead
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import PointerRef

# Zones remembered by pointer (a dict entry each); past it the memory starts over.
ZONES_KEPT = 4096


class VisitReadAhead:
    """The zones of the pointers a consumer's visits leased, and the read ahead of the
    visits that follow."""

    def __init__(self) -> None:
        self._zones: dict[tuple[str, int, str], ZoneId] = {}

    def before(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        tr: KVTransaction,
        *,
        room: int | None = None,
        horizon_ms: int = 0,
    ) -> None:
        """Send ``visits``' first reads in ``tr`` at once, where its store can: with the
        native SQL zones, each pointer's read and lock, then, for a zone visited before,
        its dequeue's read of up to ``room`` items (None: the visit's room) within
        ``horizon_ms``."""
        if not reads_ahead(tr):
            self._send_native(cluster, visits, tr, room, horizon_ms)
            return
        top, first = cluster.toplevel, getattr(cluster.zones, "first_reads", None)
        keys: list[bytes] = []
        ranges: list[tuple[bytes, bytes, int]] = []
        for v in visits:
            keys += top.lease_reads(v.ref)
            zone = self._zones.get((v.ref.cluster, v.ref.shard, v.ref.pointer_id))
            if zone is not None and first is not None:
                ranges += first(zone, v.room)
        read_ahead(tr, keys, ranges)

    def _send_native(
        self,
        cluster: Cluster,
        visits: Sequence[ZoneVisit],
        tr: KVTransaction,
        room: int | None,
        horizon_ms: int,
    ) -> None:
        send_lease = getattr(cluster.toplevel, "send_lease_read", None)
        send_dequeue = getattr(cluster.zones, "send_dequeue_read", None)
        if send_lease is None or send_dequeue is None:
            return
        for v in visits:
            if not send_lease(v.ref, tr):
                return  # statements sent at once (SQLite): nothing to gain
        for v in visits:
            zone = self._zones.get((v.ref.cluster, v.ref.shard, v.ref.pointer_id))
            if zone is not None:
                send_dequeue(zone, v.room if room is None else min(v.room, room), horizon_ms, tr)

    def leased(self, ref: PointerRef, zone: ZoneId) -> None:
        """``ref``'s pointer was leased and names ``zone``."""
        zones = self._zones
        if len(zones) >= ZONES_KEPT:
            zones.clear()
        zones[(ref.cluster, ref.shard, ref.pointer_id)] = zone

"""The pull leaser's peek: the vested pointers of one app's zones, for the consumer's
:class:`~quickzones.consumer.scanner.Scanner` (a local consumer peeks every zone's and
leaves another app's at its pointer lease; a server answers one app's request, so its
peek reads each pointer's record, snapshot, and pages past other apps' pointers)."""

from __future__ import annotations

from quickzones.clock import now_ms
from quickzones.consumer.state import Cluster
from quickzones.errors import CorruptRecord
from quickzones.store.keys import LOCAL_APP
from quickzones.store.kv import KVTransaction, run
from quickzones.store.pointer_repair import set_aside as set_aside_pointer
from quickzones.store.records import ZoneId, decode_pointer
from quickzones.store.toplevel import PointerRef

ZONES_REMEMBERED = 100_000  # pointer ids whose zone is kept (then it starts over)


class AppPointers:
    """Peeks of one app's vested pointers, each pointer's zone read once."""

    def __init__(self, pages_max: int) -> None:
        self.pages_max = pages_max  # windows read past other apps' pointers
        self.zones: dict[tuple[str, int, str], ZoneId] = {}

    def peek(
        self, app: str | None, cluster: Cluster, shard: int, window: int, horizon_ms: int
    ) -> tuple[list[PointerRef], int | None]:
        """The Scanner's peek (:data:`~quickzones.consumer.selection.Peek`) for a pull
        lease: vested pointers of one shard whose zone
        belongs to ``app`` (None: any app but the cluster's local work), oldest first, at
        most ``window``, reading up to ``pages_max`` windows past other apps' pointers;
        snapshot reads, no conflicts."""
        top = cluster.toplevel
        keys = top.keys
        begin, end = keys.pointer_vested_range(top.cluster, shard, now_ms(top.clock))
        out: list[PointerRef] = []
        for _ in range(self.pages_max):
            spoilt: list[tuple[PointerRef, str]] = []

            def page(
                tr: KVTransaction,
                start: bytes = begin,
                spoilt: list[tuple[PointerRef, str]] = spoilt,
            ) -> list[tuple[PointerRef, ZoneId]]:
                tr.set_causal_read_risky()
                spoilt.clear()
                rows = tr.get_range(start, end, limit=window, snapshot=True)
                found = []
                for key, _ in rows:
                    vesting, pointer_id = keys.unpack_pointer_vesting_key(top.cluster, shard, key)
                    ref = PointerRef(shard, pointer_id, vesting, top.cluster)
                    zone = self.zones.get((top.cluster, shard, pointer_id))
                    if zone is None:
                        pkey = keys.pointer_key(top.cluster, shard, pointer_id)
                        raw = tr.get(pkey, snapshot=True)
                        if raw is None:
                            continue
                        try:
                            zone = decode_pointer(pkey, raw).zone
                        except CorruptRecord as err:
                            spoilt.append((ref, err.reason))
                            continue
                        self._remember(top.cluster, shard, pointer_id, zone)
                    found.append((ref, zone))
                return found

            rows = run(top.kv, page)
            for ref, reason in spoilt:
                # As a local consumer's pointer lease does: keep the bytes, rebuild the
                # pointer for its zone (vesting now), so the next window leases it.
                set_aside_pointer(top, ref, reason)
            out.extend(
                ref
                for ref, zone in rows
                if zone.app != LOCAL_APP and (app is None or zone.app == app)
            )
            if out or len(rows) < window:
                break
            last = rows[-1][0]
            begin = keys.pointer_vesting_key(top.cluster, shard, last.vesting_ms, last.pointer_id)
            begin += b"\x00"
        return out[:window], None

    def _remember(self, cluster: str, shard: int, pointer_id: str, zone: ZoneId) -> None:
        """A pointer's zone never changes (a zone that loses its pointer gets a new id),
        so scans read each pointer's record once, not at every scan."""
        if len(self.zones) >= ZONES_REMEMBERED:
            self.zones.clear()
        self.zones[(cluster, shard, pointer_id)] = zone

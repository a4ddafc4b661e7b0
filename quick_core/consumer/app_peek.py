"""The pull leaser's peek: the vested pointers of one app's zones, for the consumer's
:class:`~quickzones.consumer.scanner.Scanner` (a local consumer peeks every zone's and
leaves another app's at its pointer lease; a server answers one app's request, so its
peek pages through the top-level queue's vested pointers with their zones
(:meth:`~quickzones.store.toplevel.TopLevelQueue.vested_zones`), past other apps')."""

from __future__ import annotations

from quickzones.consumer.state import Cluster
from quickzones.store.keys import LOCAL_APP
from quickzones.store.toplevel import PointerRef


class AppPointers:
    """Peeks of one app's vested pointers."""

    def __init__(self, pages_max: int) -> None:
        self.pages_max = pages_max  # windows read past other apps' pointers

    def peek(
        self, app: str | None, cluster: Cluster, shard: int, window: int, horizon_ms: int
    ) -> tuple[list[PointerRef], int | None]:
        """The Scanner's peek (:data:`~quickzones.consumer.selection.Peek`) for a pull
        lease: vested pointers of one shard whose zone
        belongs to ``app`` (None: any app but the cluster's local work), oldest first, at
        most ``window``, reading up to ``pages_max`` windows past other apps' pointers;
        snapshot reads, no conflicts."""
        out: list[PointerRef] = []
        after: PointerRef | None = None
        for _ in range(self.pages_max):
            rows = cluster.toplevel.vested_zones(shard, window, after=after)
            out.extend(
                ref
                for ref, zone in rows
                if zone.app != LOCAL_APP and (app is None or zone.app == app)
            )
            if out or len(rows) < window:
                break
            after = rows[-1][0]
        return out[:window], None

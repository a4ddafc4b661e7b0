"""Random-mode peeks that read what they select: a slice at a random rank of the window.

Algorithm 1's random mode selects a random ``selection_frac`` of a shard's oldest
``peek_max`` vested pointers, so that consumers scanning at once spread over the zones.
Reading and decoding the whole window on every scan costs what it reads, not what it
selects: 1,000 pointer keys are about 10 ms of a consumer's CPU, for the 10 it takes. On
the 16-core machine eight consumers' scanners (seven of them in random mode) used half a
core each on that alone, against 0.08 for the one in-order scanner alone, and each
consumer did 330 no-op items a second against 820 alone (``docs/performance.md``,
"Scaling out").

So a full peek of a shard comes again only once ``REFRESH_SLICES`` scans sliced the
window the last one recorded and ``REFRESH_S`` passed, or after ``STALE_S`` (and whenever
what it saw is too small to slice), and records the window it read: each pointer's place in the
vesting order. The scans between read only a slice of that shard: four times the
pointers the draw takes (40 of 1,000 by default; at least ``SLICE_LEN``), from the place
of a pointer chosen at random in the recorded window, and draw from the slice at random
what they would have drawn from the window. Each pointer is about as likely to be drawn
as from the window, so two consumers share as many pointers on average (k * k / n for
draws of k from n), and a slice four times the draw keeps how many they share, when they
do, close to the window's. Eight consumers scanning at the same instant
(``tests/unit/test_selection_contention.py``'s fleet, 16 seeds) lost 2.9 % of their
pointer leases on average and 4.3 % at worst, as with full peeks (2.8 %, 4.3 %); with
slices of twice the draw whose first pointers were the draw, 4.0 % and 9 %. A recorded
place is a key, not a pointer: one that moved since (leased, requeued) reads the pointers
after it. A slice that meets the end of the vested pointers (the window moved on or
shrank) is not used: the scan peeks the shard in full.

The in-order scanner (paper section 4.2) and the pull leaser's peeks (one app's zones)
read their windows in full as before: they take the oldest, not a random draw. So does a
scan of a shard whose last full peek saw a weighted tenant's pointer: its draw is
weighted (:class:`~quickzones.consumer.selection.Selection`), which needs every weight.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from quickzones.consumer.state import Cluster
from quickzones.store.toplevel import PointerRef

# When a shard's next scan peeks it in full again: its recorded window is REFRESH_S old
# and has served REFRESH_SLICES slices, or is STALE_S old. Places shift as pointers are
# leased and requeued: a quarter second keeps them close. The count keeps a full peek
# (about ten slices' CPU) to one in 32 of a shard's scans where scans spread over many
# shards, each touched a few times a second; the age bounds how far places drift.
REFRESH_S = 0.25
REFRESH_SLICES = 32
STALE_S = 2.0
# Pointers a slice reads: four times the draw (a random draw from 40 consecutive
# pointers, not a run of 10: consumers drawing at once rarely share a run), at least this.
SLICE_LEN = 16
SLICE_FACTOR = 4
# A window of fewer vested pointers than two slices is read in full each scan.
SLICE_AT = 2 * SLICE_LEN

# (cluster, shard, window, horizon_ms, start) -> the shard's vested pointers from
# ``start``'s place on, oldest first, at most ``window``; as selection.peek_shard.
SlicePeek = Callable[
    [Cluster, int, int, int, PointerRef | None], tuple[list[PointerRef], int | None]
]


@dataclass(slots=True)
class _Window:
    places: list[PointerRef]  # the full peek's vested pointers, oldest first
    window: int  # the window that peek read (peek_max)
    at: float  # monotonic time of the peek
    served: int = 0  # slices read from it


class RandomSlices:
    """A random-mode scanner's recorded windows, one a (cluster, shard)."""

    def __init__(
        self,
        peek: SlicePeek,
        rng: random.Random,
        *,
        monotonic: Callable[[], float] = time.monotonic,  # a test's clock, passed in
    ) -> None:
        self.peek = peek
        self.rng = rng
        self.monotonic = monotonic
        self._windows: dict[tuple[str, int], _Window] = {}

    def record(self, cluster: Cluster, shard: int, vested: list[PointerRef], window: int) -> None:
        """A full peek of ``shard`` read ``vested`` (the window ``window``)."""
        key = (cluster.name, shard)
        if len(vested) < SLICE_AT:
            self._windows.pop(key, None)
        else:
            self._windows[key] = _Window(list(vested), window, self.monotonic())

    def slice(
        self,
        cluster: Cluster,
        shard: int,
        horizon_ms: int,
        draw_size: Callable[[int], int],
    ) -> tuple[list[PointerRef], int, int] | None:
        """A slice of ``shard`` at a random place of its recorded window: the pointers
        read (``SLICE_FACTOR`` times ``draw_size(n)``, at least ``SLICE_LEN``), ``n`` (the vested
        pointers the window held) and the window; None when a full peek is due (no window
        recorded, too old, or the slice met the end of the vested pointers)."""
        key = (cluster.name, shard)
        recorded = self._windows.get(key)
        if recorded is None:
            return None
        age = self.monotonic() - recorded.at
        if age > STALE_S or (age > REFRESH_S and recorded.served >= REFRESH_SLICES):
            return None
        n = len(recorded.places)
        k = draw_size(n)
        if k <= 0:
            return None
        want = min(n, max(SLICE_LEN, SLICE_FACTOR * k))
        start = recorded.places[self.rng.randrange(max(1, n - want + 1))]
        pointers, _ = self.peek(cluster, shard, want, horizon_ms, start)
        if len(pointers) < want:
            self._windows.pop(key, None)  # the vested end is near: read the shard afresh
            return None
        recorded.served += 1
        return pointers, n, recorded.window

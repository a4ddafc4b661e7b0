"""Where a zone's dequeue read starts in the native SQL zones (docs/backends.md, "Beside
long transactions").

Every lease and completion leaves its item's old versions' entries in the items'
``(zone, priority, vesting_ms)`` index, and while a report holds an old snapshot
PostgreSQL can neither vacuum them nor mark them dead in the index: a dequeue that read a
zone's vested items from its start fetched every completed item's row to find it dead,
more every second the snapshot stayed open. So a read starts from what the last read of
the zone learned, a :class:`Floor`:

- No item is written vesting before its writer's clock (a delay is never negative; a
  lease, a retry and a release vest later), and a writer's clock may lag the reader's by
  at most ``FLOOR_SKEW_MS``: every item written after a read at ``now`` vests at or after
  ``now - FLOOR_SKEW_MS`` (the cut).
- A read that saw every vested item of the zone (no more than it asked for) knows every
  item then vested at or after the earliest it saw; the rest vest after ``now``.
- A read that saw only the first vested items, in the zone's order (priority, vesting
  time), knows nothing vested then at a priority before its first item's, and nothing
  vested before that item at its priority; of later priorities, only what the floor it
  read from said.

The read then starts at its first priority's floor (an index start key: the entries
before it are never visited), and skips older entries of other priorities on the index
alone. Every ``FULL_READ_MS`` a zone is read from its start again: an item written inside
an application's transaction that stayed open longer than the skew commits below the
floor, and is found then. Kept per process for the zones it reads, at most
``MOST_ZONES`` (then all forgotten at once: each is read from its start again).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quickzones.store.sql.toplevel import FLOOR_SKEW_MS

FULL_READ_MS = 5_000
MOST_ZONES = 100_000
# Beyond any priority or vesting time stored (both are 64-bit in the tables).
LOWEST = -(2**62)
HIGHEST = 2**62


@dataclass(frozen=True, slots=True)
class Floor:
    """What every item of a zone satisfies: at a priority before ``priority`` it vests at
    or after ``low``; at ``priority``, at or after ``at``; at a later one, at or after
    ``high`` (never after ``at``)."""

    low: int
    priority: int
    at: int
    high: int

    def args(self) -> dict[str, int]:
        """The dequeue read's parameters (``dequeue_read``)."""
        return {"f_low": self.low, "p0": self.priority, "v0": self.at, "f_high": self.high}


# A read from the zone's start: nothing is before the lowest priority, and every item at
# or after it qualifies.
FROM_START = Floor(low=LOWEST, priority=LOWEST, at=LOWEST, high=LOWEST)


def learned(used: Floor, now: int, vested: list[tuple[int, int]], complete: bool) -> Floor:
    """The floor a read at ``now`` from ``used`` learned: ``vested`` the (priority, vesting
    time) of the vested items it read, in order; ``complete`` where those were all."""
    cut = now - FLOOR_SKEW_MS
    if not vested:
        # Nothing vested: every item vests after now, or was written after the read.
        return Floor(low=cut, priority=HIGHEST, at=cut, high=cut)
    first_priority, first_vesting = vested[0]
    at = min(first_vesting, cut)
    if complete:
        high = min(min(v for _, v in vested), cut)
    else:
        # Later priorities' items were not read: only the floor read from bounds them.
        high = min(used.low, used.at, used.high, at)
    return Floor(low=cut, priority=first_priority, at=at, high=min(high, at))


class ItemFloors:
    """The floors of the zones this process reads, by packed zone."""

    def __init__(self) -> None:
        # zone -> (floor, when a read last started from the zone's start)
        self._floors: dict[bytes, tuple[Floor, int]] = {}

    def floor(self, zone: bytes, now: int) -> Floor:
        """Where a read of ``zone`` at ``now`` starts (:data:`FROM_START` where none is
        known, or the last read from the start is ``FULL_READ_MS`` old)."""
        kept = self._floors.get(zone)
        if kept is None or now - kept[1] >= FULL_READ_MS:
            return FROM_START
        return kept[0]

    def learn(
        self,
        zone: bytes,
        used: Floor,
        now: int,
        vested: Iterable[tuple[int, int]],
        complete: bool,
    ) -> None:
        """What a read of ``zone`` at ``now`` from ``used`` saw (:func:`learned`)."""
        kept = self._floors.get(zone)
        if used is FROM_START:
            full_at = now
        elif kept is not None:
            full_at = kept[1]
        else:
            return  # forgotten since it was sent: the next read is from the start
        if kept is None and len(self._floors) >= MOST_ZONES:
            self._floors.clear()
        self._floors[zone] = (learned(used, now, list(vested), complete), full_at)

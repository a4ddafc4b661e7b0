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
alone.

An item written before the read by a transaction still open then (an application's
request that enqueued and went on) is not seen by it, and may vest below what it learned.
Where the read also returns its snapshot's oldest running transaction id and next id
(PostgreSQL: ``pg_current_snapshot()``), the floor is held at or below when the oldest
writer still running got its id (:class:`WriterHorizon`), less the skew: such an item is
read as soon as its transaction commits, and a report that only reads (it has no
transaction id) holds no floor back. Elsewhere (SQLite) a zone is read from its start
every ``FULL_READ_MS``, and such an item is found then. A writer whose clock lags by more
than the skew writes below every floor: a zone is read from its start every
``LAGGING_WRITER_READ_MS`` where the floors are held below the running writers, every
``FULL_READ_MS`` elsewhere, and such an item is found then. Kept per process for the
zones it reads, at most ``MOST_ZONES`` (then all forgotten at once: each is read from its
start again).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from quickzones.store.sql.toplevel import FLOOR_SKEW_MS

FULL_READ_MS = 5_000
# Where the floors are held below the running writers, reads from the start are only for
# writers whose clocks lag past the skew: rarer, as each walks every version kept.
LAGGING_WRITER_READ_MS = 60_000
MOST_ZONES = 100_000
# WriterHorizon: at most this many samples a second kept, for at most this long (a writer
# open longer holds every floor at the zone's start until it ends).
SAMPLE_EVERY_MS = 100
SAMPLES_KEPT = 36_000
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

    def capped(self, cap: int) -> Floor:
        """This floor, no bound above ``cap``."""
        return Floor(min(self.low, cap), self.priority, min(self.at, cap), min(self.high, cap))

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


class WriterHorizon:
    """When transaction ids were handed out, as this process's reads saw them.

    Each sample ``(at, next_id)`` is a read's clock before it was sent and the next
    transaction id of the snapshot it read with: a transaction whose id is at or past
    ``next_id`` got it after ``at``, so everything it writes vests at or after
    ``at - FLOOR_SKEW_MS``. Any subset of the samples gives a true bound; they are thinned
    to one each ``SAMPLE_EVERY_MS``, increasing in both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: deque[int] = deque(maxlen=SAMPLES_KEPT)
        self._ats: deque[int] = deque(maxlen=SAMPLES_KEPT)

    def record(self, at: int, next_id: int) -> None:
        with self._lock:
            if self._ats and (at < self._ats[-1] + SAMPLE_EVERY_MS or next_id < self._ids[-1]):
                return
            self._ids.append(next_id)
            self._ats.append(at)

    def floor_for(self, oldest_running: int) -> int:
        """The earliest a transaction whose id is ``oldest_running`` or later writes an
        item to vest (:data:`LOWEST` where no sample is that old)."""
        with self._lock:
            k = bisect.bisect_right(self._ids, oldest_running)
            return LOWEST if k == 0 else self._ats[k - 1] - FLOOR_SKEW_MS


class ItemFloors:
    """The floors of the zones this process reads, by packed zone."""

    def __init__(self) -> None:
        # zone -> (floor, when a read last started from the zone's start, how often one
        # must: FULL_READ_MS or, held below the running writers, LAGGING_WRITER_READ_MS)
        self._floors: dict[bytes, tuple[Floor, int, int]] = {}
        self.writers = WriterHorizon()
        self.reads_from_start = 0  # learned from: each walked every version the zone keeps

    def floor(self, zone: bytes, now: int) -> Floor:
        """Where a read of ``zone`` at ``now`` starts (:data:`FROM_START` where none is
        known, or where the last read from the start is as old as its interval)."""
        kept = self._floors.get(zone)
        if kept is None:
            return FROM_START
        floor, full_at, every = kept
        return FROM_START if now - full_at >= every else floor

    def learn(
        self,
        zone: bytes,
        used: Floor,
        now: int,
        vested: Iterable[tuple[int, int]],
        complete: bool,
        snapshot: tuple[int, int] | None = None,
    ) -> None:
        """What a read of ``zone`` at ``now`` from ``used`` saw (:func:`learned`);
        ``snapshot``: the oldest running and the next transaction id of the snapshot it
        read with, where the store tells them."""
        kept = self._floors.get(zone)
        if used is FROM_START:
            self.reads_from_start += 1
            full_at = now
        elif kept is not None:
            full_at = kept[1]
        else:
            return  # forgotten since it was sent: the next read is from the start
        cap, every = HIGHEST, FULL_READ_MS
        if snapshot is not None:
            oldest_running, next_id = snapshot
            self.writers.record(now, next_id)
            cap, every = self.writers.floor_for(oldest_running), LAGGING_WRITER_READ_MS
        if kept is None and len(self._floors) >= MOST_ZONES:
            self._floors.clear()
        floor = learned(used, now, list(vested), complete)
        self._floors[zone] = (floor.capped(cap), full_at, every)

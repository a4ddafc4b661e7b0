"""Where a consumer's visits left their zones' pointers, told to its scanner: whether the
next scan can wait (paper Algorithm 1's loop; issue 44 points 2 and 5).

A visit that empties its zone requeues the pointer to vest later (its leased items'
lease, the zone's delayed items, or ``min_inactive_s``) or collects it. If the last scan
chose every vested pointer it saw, a peek right after such visits finds only what came
since that scan began: a local enqueue (which wakes the scanner), another process's
commit (which the scanner's idle wait watches for, from counters read before that
scan's peeks) or a pointer vesting by time (the wait's timer, these zones' vesting times
included). So the scanner waits instead: a consumer serving tenants that enqueue now and
then peeked two or three times an item, all but the first empty
(``tests/unit/test_scans_after_visits.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

Key = tuple[str, int, str]  # a pointer: cluster, shard, pointer id (visit.visit_key)


class RequeuedZones:
    """The vesting time each zone's pointer got from a visit committed since the last
    scan began (None: collected), by visit key; told by the managers' visits, read by
    the scanner's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: dict[Key, int | None] = {}

    def told(self, key: Key, vests_ms: int | None) -> None:
        """A visit committed: ``key``'s pointer vests at ``vests_ms`` (None: collected)."""
        with self._lock:
            self._told[key] = vests_ms

    def clear(self) -> None:
        """A scan begins: its peeks see what was told before."""
        with self._lock:
            self._told.clear()

    def all_later(self, keys: Iterable[Key]) -> tuple[bool, int | None]:
        """Whether every zone of ``keys`` was told since the last scan began (one a visit
        did not lease, for want of room, lost, or whose visit was written off, may still
        be vested: the scanner peeks), and the soonest vesting time told (None: none)."""
        with self._lock:
            if any(key not in self._told for key in keys):
                return False, None
            vesting = [ms for ms in self._told.values() if ms is not None]
        return True, min(vesting, default=None)

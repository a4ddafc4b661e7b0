"""A consumer's view of the tenant weights (issue 31 point 1;
:mod:`quickzones.store.weights`): how a scan (Algorithm 1) chooses and orders the
pointers it selected, and how much a visit (Algorithm 2) takes.

A tenant of weight w gets w times the share of a tenant of weight 1 where they contend:

* a visit to its zone takes at most its weighted turn: this consumer keeps, per zone, the
  items it dequeued divided by the zone's weight (its "pass", as in stride scheduling),
  and a visit may take the zone's pass up to the lowest pass among the zones it visited
  in the last ``HORIZON_S`` plus one visit's size (``dequeue_max``, or the
  work-conserving share); so the zones it visits take in the ratio of their weights
  however often each is visited, and a zone that took less than it might (it had no more,
  or the rest was paused or limited) holds no one back. A weight-w zone's visit takes w
  times the visit's size when it is the furthest behind;
* its items run in a workers' lane of its weight (:class:`~quickzones.consumer.pool.
  FairQueue`: w turns to a weight-1 lane's);
* the scan orders the zones it selected by the items this consumer holds of each divided
  by its weight (water-filling, weighted), so while the consumer is full each freed slot
  goes to the zone furthest below its weighted share;
* a random scan samples its fraction of each peek weighted (Efraimidis-Spirakis keys), so
  consumers that each see only some pointers still favour the heavy ones.

A scanner learns a pointer's zone once it leases it, so its scan weighs the pointers
this consumer has visited before (their zones are remembered here) and any other as 1; a
pull leaser reads every vested pointer's record, so its scan weighs each by its zone from
the first (otherwise a heavy zone met late would start level with the light ones that
took a lead meanwhile, the stride's rule for a newcomer, and never get that lead back).
A zone of an app with no weight stored takes none of this: its visit is the unweighted
one, and what it costs is its app's weight lookup (cached, checked once a ``REFRESH_S``),
whatever other apps store (issue 43 point 1: one weight in another app turned every
app's visits into weighted turns, and ``run_until_idle`` left 1,844 of 2,400 items).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from quickzones.errors import StorageError
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import PointerRef
from quickzones.store.weights import Weights

PointerKey = tuple[str, int, str]  # (cluster, shard, pointer id), as Work.pointer_key

# Zones remembered per consumer (a dict entry each); past this the memory starts over, and
# pointers weigh 1 until visited again.
MAX_REMEMBERED = 100_000
# A zone not visited for this long is no longer competing: its pass no longer holds the
# others back, and it starts again level with them.
HORIZON_S = 1.0
LOW_EVERY_S = 0.02


class Weighing:
    """The weights one consumer reads, and the zones of the pointers it has visited."""

    def __init__(
        self, emit: Callable[..., Any], weights: Weights | None = None
    ) -> None:
        self.weights = weights  # set by Quick.consumer; None: every tenant weighs 1
        self.emit = emit
        self._lock = threading.Lock()  # managers visit concurrently
        self._zones: dict[PointerKey, ZoneId] = {}
        # Per zone (by pointer): items dequeued / weight, when last visited, whether its
        # last visit took less than it might, and the turn its visit in progress has.
        self._pass: dict[PointerKey, float] = {}
        self._seen: dict[PointerKey, float] = {}
        self._idle: set[PointerKey] = set()
        self._turns: dict[PointerKey, tuple[int, float]] = {}
        self._low: float | None = None  # the lowest pass, as worked out at _low_at
        self._low_at = 0.0

    def weight_of(self, zone: ZoneId) -> float | None:
        """``zone``'s weight (looked up, cached: :mod:`quickzones.store.meta_sets`), None
        when its app has no weight stored (the unweighted path); while the store cannot
        be read, the last one read."""
        if self.weights is None:
            return None
        try:
            return self.weights.of_zone(zone)
        except StorageError as err:
            self.emit("limits_error", error=str(err))
            return self.weights.last_of(zone)

    def of_zone(self, zone: ZoneId) -> float:
        """``zone``'s weight now (1 when its app has none): its workers' lane's."""
        found = self.weight_of(zone)
        return 1.0 if found is None else found

    def visit_rule(self) -> VisitWeight | None:
        """A visit's room for each zone by weight; None when no weight store is wired. A
        zone of an app with no weight keeps its room, and takes no part in the turns."""
        if self.weights is None:
            return None

        def weigh(ref: PointerRef, zone: ZoneId, room: int, free: int | None) -> int:
            w = self.weight_of(zone)
            if w is None:  # unweighted: as if no rule applied
                return room if free is None else min(room, free)
            key = (ref.cluster, ref.shard, ref.pointer_id)
            now = time.monotonic()
            with self._lock:
                self._seen[key] = now
                turn = self._turn(now, key, room, w, fresh=False)
                if turn == 0:  # refused on a lowest pass that may be old: look again
                    turn = self._turn(now, key, room, w, fresh=True)
                if free is not None:
                    turn = min(turn, free)
                self._turns[key] = (turn, w)
            return turn

        return weigh

    def took(self, pointer_key: PointerKey | None, zone: ZoneId, n: int) -> None:
        """A weighted visit through ``pointer_key`` dequeued ``n`` items of ``zone``."""
        if pointer_key is None or self.weights is None:
            return
        with self._lock:
            if len(self._zones) >= MAX_REMEMBERED and pointer_key not in self._zones:
                self._forget()
            self._zones[pointer_key] = zone
            turn = self._turns.pop(pointer_key, None)
            if turn is None:
                return  # an unweighted visit (no weight stored when it began)
            allowed, w = turn
            self._pass[pointer_key] = self._pass.get(pointer_key, 0.0) + n / w
            if n < allowed:
                self._idle.add(pointer_key)  # had no more to give: holds no one back
            else:
                self._idle.discard(pointer_key)

    def _turn(self, now: float, key: PointerKey, room: int, w: float, *, fresh: bool) -> int:
        low = self._lowest_pass(now, key, fresh)
        own = max(self._pass.get(key, low), low)  # no credit for time away
        self._pass[key] = own
        turn = max(0, math.floor((low + room - own) * w + 1e-9))
        return max(1, turn) if own <= low else turn  # the furthest behind always moves

    def _lowest_pass(self, now: float, key: PointerKey, fresh: bool) -> float:
        """The lowest pass among the zones visited within HORIZON_S that took all they
        might at their last visit (``key``'s own when there is none). Worked out at most
        once each LOW_EVERY_S: it is a walk over every zone visited in the last second,
        and a slightly old lowest pass only lets a zone run a little further ahead."""
        if not fresh and now - self._low_at < LOW_EVERY_S and self._low is not None:
            return self._low
        since = now - HORIZON_S
        stale = [k for k, at in self._seen.items() if at < since]
        for k in stale:
            del self._seen[k]
            self._pass.pop(k, None)
            self._idle.discard(k)
        passes = [self._pass[k] for k in self._seen if k in self._pass and k not in self._idle]
        if not passes:
            return self._pass.get(key, 0.0)
        self._low, self._low_at = min(passes), now
        return self._low

    def _forget(self) -> None:
        self._low = None
        self._zones.clear()
        self._pass.clear()
        self._seen.clear()
        self._idle.clear()
        self._turns.clear()

    def by_pointer(
        self, zone_of: Callable[[PointerKey], ZoneId | None] | None = None
    ) -> Callable[[PointerRef], float] | None:
        """A scan's weight of each pointer; None when no weight store is wired. A
        pointer's zone is the one ``zone_of`` gives (a scan that read the pointers' records
        knows every zone), else the one remembered from a visit; a zone not known, or of
        an app with no weight, weighs 1. Each weight is its zone's lookup (cached), once
        per pointer for the callable returned (one scan, one claim): a scan's weighing
        costs what it peeked, never the number of weighted tenants, and the scan's three
        uses of a pointer's weight (passing over, the weighted sample, the water-filling
        order) do not look it up three times (issue 40 point 9)."""
        if self.weights is None:
            return None
        zones = self._zones
        known: dict[PointerKey, float] = {}

        def weight(ref: PointerRef) -> float:
            key = (ref.cluster, ref.shard, ref.pointer_id)
            found = known.get(key)
            if found is not None:
                return found
            zone = None if zone_of is None else zone_of(key)
            if zone is None:
                zone = zones.get(key)
            found = known[key] = 1.0 if zone is None else self.of_zone(zone)
            return found

        return weight


# (the visit's pointer, its zone, the visit's room, the free capacity or None) -> the
# zone's room by weight.
VisitWeight = Callable[[PointerRef, ZoneId, int, int | None], int]

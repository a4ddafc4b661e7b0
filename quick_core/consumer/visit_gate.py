"""When a zone visit tries one transaction (``one_transaction_visits``) and when it takes
the paper's three.

One commit per visit saves two commits when nobody else visits the zone; when consumers
compete for few zones, a conflicting one-transaction visit has done a whole dequeue for
nothing, where the three transactions' small pointer lease would have lost cheaply. So
after a conflict the next visits take three transactions for a stretch of time that
doubles while conflicts go on and halves again with each one-transaction visit that
commits.

A stretch of time, not of visits: a burst of enqueues into one zone conflicts with the
visits of that zone while it lasts, and three-transaction visits must not outlive it.
Counted in visits, a few conflicts in a burst made the next hundreds of visits take three
transactions each (on PostgreSQL, whose commits queue on one lock, a batch of four zones
then took 40-90 ms where one commit takes 5), long after the burst had ended, and every
small tenant's pickup waited behind them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

from quickzones.clock import Clock, ElapsedClock

FIRST_HOLD_S = 0.01  # three transactions for this long after a first conflict
MAX_HOLD_S = 1.0  # competing consumers try one transaction again at least once a second
# A zone that conflicted within this long is visited in a transaction of its own, never
# batched with other zones: its next conflict writes off its own visit alone.
ALONE_S = 1.0


# Zones held to three transactions at most, before those whose hold ran out are dropped
# (a consumer that sees conflicts on this many zones at once holds no more state).
MAX_HELD_ZONES = 10_000


class OneTransactionGate:
    """Shared by one consumer's managers (or one server's pull visits). Per zone: a
    conflict puts the zone that conflicted on three transactions, not every zone the
    consumer visits (a busy tenant's enqueues conflicted with its visits every few ms in
    ``quick demo``, and each conflict put every small tenant's visit on three commits for
    10 ms or more: their pickups waited 15-25 ms behind a batch of such visits)."""

    def __init__(
        self,
        enabled: bool,
        clock: Clock,
        *,
        first_hold_s: float = FIRST_HOLD_S,
        max_hold_s: float = MAX_HOLD_S,
    ) -> None:
        self.enabled = enabled
        # Elapsed time, which no step of the wall clock stretches (a clock set back an hour
        # must not hold one-transaction visits off for an hour).
        self._elapsed = clock.monotonic if isinstance(clock, ElapsedClock) else time.monotonic
        self.first_hold_s = first_hold_s
        self._max_hold_s = max_hold_s
        # zone key -> (three transactions until this elapsed time, its next hold)
        self._held: dict[Hashable, tuple[float, float]] = {}
        # zone key -> when it last conflicted (elapsed time)
        self._conflicted_at: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def try_one(self, key: Hashable) -> bool:
        """Whether a visit of the zone ``key`` tries one transaction."""
        if not self.enabled:
            return False
        held = self._held.get(key)
        return held is None or self._elapsed() >= held[0]

    def alone(self, key: Hashable) -> bool:
        """Whether the zone ``key`` conflicted within ``ALONE_S`` (or is held to three
        transactions): its visit is not batched with other zones'. Its producer is likely
        still enqueueing, and a batch's conflict writes off every zone in it (``quick
        demo``: one small tenant's item in twenty waited for two such batches, its
        pickup's p95 to p99)."""
        if not self.enabled:
            return False
        at = self._conflicted_at.get(key)
        return (at is not None and self._elapsed() - at < ALONE_S) or not self.try_one(key)

    def conflicted(self, key: Hashable) -> None:
        """A one-transaction visit of the zone ``key`` conflicted: its next visits take
        three transactions, for a stretch that doubles while its conflicts go on, and
        for ``ALONE_S`` it is visited apart from other zones."""
        with self._lock:
            now = self._elapsed()
            _, hold = self._held.get(key, (now, self.first_hold_s))
            self._held[key] = (now + hold, min(hold * 2, self._max_hold_s))
            if len(self._held) > MAX_HELD_ZONES:
                self._held = {k: h for k, h in self._held.items() if h[0] > now}
            # Kept in the order of their last conflicts: past MAX_HELD_ZONES the oldest go.
            self._conflicted_at.pop(key, None)
            self._conflicted_at[key] = now
            while len(self._conflicted_at) > MAX_HELD_ZONES:
                del self._conflicted_at[next(iter(self._conflicted_at))]

    def committed(self, key: Hashable) -> None:
        """A one-transaction visit of the zone ``key`` committed: its next hold halves,
        and a zone back at the first hold is forgotten."""
        if key not in self._held:
            return
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return
            hold = held[1] / 2
            if hold <= self.first_hold_s:
                del self._held[key]
            else:
                self._held[key] = (held[0], hold)

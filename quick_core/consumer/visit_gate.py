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

from quickzones.clock import Clock, ElapsedClock

FIRST_HOLD_S = 0.01  # three transactions for this long after a first conflict
MAX_HOLD_S = 1.0  # competing consumers try one transaction again at least once a second


class OneTransactionGate:
    """Shared by one consumer's managers (or one server's pull visits)."""

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
        self._hold_s = first_hold_s
        self._until = float("-inf")  # three transactions until this (elapsed) time
        self._lock = threading.Lock()

    def try_one(self) -> bool:
        """Whether this visit tries one transaction."""
        return self.enabled and self._elapsed() >= self._until

    def conflicted(self) -> None:
        """A one-transaction visit's commit conflicted: the next visits take three."""
        with self._lock:
            self._until = self._elapsed() + self._hold_s
            self._hold_s = min(self._hold_s * 2, self._max_hold_s)

    def committed(self) -> None:
        with self._lock:
            self._hold_s = max(self.first_hold_s, self._hold_s / 2)

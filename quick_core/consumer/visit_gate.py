"""When a zone visit tries one transaction (``one_transaction_visits``) and when it takes
the paper's three.

One commit per visit saves two commits when nobody else visits the zone; when consumers
compete for few zones, a conflicting one-transaction visit has done a whole dequeue for
nothing, where the three transactions' small pointer lease would have lost cheaply. So
after a conflict the next visits take three transactions, for a stretch that doubles
while conflicts go on and halves again with each one-transaction visit that commits.
"""

from __future__ import annotations

import threading


class OneTransactionGate:
    """Shared by one consumer's managers (or one server's pull visits)."""

    def __init__(self, enabled: bool, *, first_hold: int = 8, max_hold: int = 1024) -> None:
        self.enabled = enabled
        self._first_hold = first_hold
        self._max_hold = max_hold
        self._hold = first_hold
        self._skip = 0
        self._lock = threading.Lock()

    def try_one(self) -> bool:
        """Whether this visit tries one transaction."""
        if not self.enabled:
            return False
        with self._lock:
            if self._skip > 0:
                self._skip -= 1
                return False
            return True

    def conflicted(self) -> None:
        """A one-transaction visit's commit conflicted: the next visits take three."""
        with self._lock:
            self._skip = self._hold
            self._hold = min(self._hold * 2, self._max_hold)

    def committed(self) -> None:
        with self._lock:
            self._hold = max(self._first_hold, self._hold // 2)

"""Maintenance a running consumer does besides the paper's algorithms: collecting expired
outcome records (status, results, dedupe windows; :mod:`quickzones.store.outcomes`), and
the keys of batches finished a week ago (:mod:`quickzones.store.batches`).

Every consumer collects, each on its own jittered period: the collection reads only the
expired start of the expiry index, so a dozen consumers cost a dozen tiny reads, and two
that take the same batch conflict and the loser moves on to what is left."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable

from quickzones.clock import Clock, now_ms
from quickzones.errors import StorageError
from quickzones.store import batches
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore
from quickzones.store.outcomes import collect_expired_outcomes

log = logging.getLogger("quick.consumer")


class OutcomeCollector:
    """Clears expired outcome records of the stores a consumer serves."""

    def __init__(
        self,
        stores: Callable[[], Iterable[tuple[KVStore, KeySpace]]],
        clock: Clock,
        interval_s: float,
        rng: random.Random,
    ) -> None:
        self._stores = stores
        self._clock = clock
        self._interval_s = interval_s
        self._rng = rng

    def collect_once(self) -> int:
        """One collection over every store; returns the records cleared."""
        cleared = 0
        for kv, keys in self._stores():
            try:
                cleared += collect_expired_outcomes(kv, keys, now_ms(self._clock))
                # Finished batches kept past their week (docs/batches.md), the same way.
                cleared += batches.collect_expired(kv, keys, now_ms(self._clock))
            except StorageError as err:  # the next period tries again
                log.warning("collecting expired outcome records failed: %s", err)
        return cleared

    def run(self, stopping: threading.Event) -> None:
        # The first wait is a random part of the period, so consumers started together
        # do not collect together.
        wait = self._rng.uniform(0, self._interval_s)
        while not stopping.wait(wait):
            self.collect_once()
            wait = self._interval_s * self._rng.uniform(0.8, 1.2)

"""Maintenance a running consumer does besides the paper's algorithms: collecting expired
outcome records (status, results, dedupe windows; :mod:`quickzones.store.outcomes`) and
the keys of batches finished a week ago (:mod:`quickzones.store.batches`), and its
heartbeat with its pickup counts (:class:`Heartbeats`, for ``quick serve``'s pages).

Every consumer collects, each on its own jittered period: the collection reads only the
expired start of the expiry index, so a dozen consumers cost a dozen tiny reads, and two
that take the same batch conflict and the loser moves on to what is left."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.pickups import PickupCounts
from quickzones.errors import StorageError
from quickzones.store import batches, heartbeats
from quickzones.store.flow_key_lapses import turn_taker
from quickzones.store.heartbeats import Heartbeat, RunningItem
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore
from quickzones.store.outcomes import collect_expired_outcomes

log = logging.getLogger("quick.consumer")

# How often a consumer writes its heartbeat and pickup counts (and ``quick serve`` its pull
# leases' counts). 5 s: the dashboard's pages follow within seconds, a consumer shows stale
# after three missed beats (15 s), and a thousand consumers cost a store 200 small
# transactions a second. Users have no reason to change it; tests pass a shorter one in.
HEARTBEAT_S = 5.0


class OutcomeCollector:
    """Clears expired outcome records of the stores a consumer serves."""

    def __init__(
        self,
        # Each store with its zone store (whose take_turn passes lapsed one-at-a-time keys).
        stores: Callable[[], Iterable[tuple[KVStore, KeySpace, object]]],
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
        for kv, keys, zones in self._stores():
            try:
                now, take_turn = now_ms(self._clock), turn_taker(zones)
                cleared += collect_expired_outcomes(kv, keys, now, take_turn=take_turn)
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


class Heartbeats:
    """Every ``interval_s`` (:data:`HEARTBEAT_S`): this consumer's heartbeat record (the
    workers page of ``quick serve``, with the items it runs now for the running page)
    and its pickup and run counts (the fairness view, history charts, run times and
    failures), written to each store it serves; a stopping consumer clears its record.
    ``quick serve`` beats through one too, for its pull leases (``idle_record=False``:
    a record only while it holds some, so a server no remote worker polls is not shown
    as a consumer)."""

    def __init__(
        self,
        clusters: Callable[[], Iterable[tuple[str, KVStore, KeySpace]]],
        consumer_id: str,
        config: ConsumerConfig,
        busy: Callable[[], tuple[int, int]],  # (workers running a handler, items held)
        holds: Callable[[str], bool],
        clock: Clock,
        interval_s: float = HEARTBEAT_S,  # shorter in tests only
        *,
        running: Callable[[], Iterable[RunningItem]] = tuple,  # what it runs now
        counts: PickupCounts | None = None,
        workers: int | None = None,  # config.workers where None
        idle_record: bool = True,
    ) -> None:
        self._clusters = clusters
        self.consumer_id = consumer_id
        self._interval_s = interval_s
        self._config = config
        self._busy = busy
        self._holds = holds
        self._clock = clock
        self._started_ms = now_ms(clock)
        self._host = socket.gethostname()
        self._running = running
        self._workers = config.workers if workers is None else workers
        self._idle_record = idle_record
        self._written = False  # a record of it is in the store (idle_record=False)
        self.pickups = counts or PickupCounts()

    def _record(self, now: int, scanner: tuple[str, ...]) -> Heartbeat:
        cfg = self._config
        running, more = heartbeats.listed(self._running())
        return Heartbeat(
            self.consumer_id, self._host, os.getpid(), self._started_ms, now,
            int(self._interval_s * 1000), self._workers, *self._busy(),
            None if cfg.apps is None else tuple(cfg.apps),
            None if cfg.job_types is None else tuple(cfg.job_types),
            scanner, running, more,
        )  # fmt: skip

    def count(self, event: str, fields: dict[str, Any]) -> None:
        """Count a consumer event the dashboard summarises: a dequeue's pickup, a run's
        time and failure (a dictionary increment: no write of its own)."""
        if event == "dequeued":
            self.pickups.dequeued(**fields)
        elif event == "ran":
            self.pickups.ran(at_ms=now_ms(self._clock), **fields)

    def beat_once(self) -> None:
        now = now_ms(self._clock)
        stores = list(self._clusters())
        record = self._record(now, tuple(name for name, _, _ in stores if self._holds(name)))
        if self._idle_record or record.running:
            self._written = True
            for _, kv, keys in stores:
                try:
                    heartbeats.beat(kv, keys, record, now)
                except StorageError as err:  # the next beat tries again
                    log.warning("writing the consumer heartbeat failed: %s", err)
        elif self._written:  # nothing held any more: no record (it expires otherwise)
            self._written = False
            self.forget()
        self.pickups.flush(stores, now)

    def stopped(self) -> None:
        """What was counted since the last beat, and no record left (a clean stop)."""
        self.pickups.flush(list(self._clusters()), now_ms(self._clock))
        self.forget()

    def forget(self) -> None:
        for _, kv, keys in self._clusters():
            try:
                heartbeats.forget(kv, keys, self.consumer_id)
            except StorageError as err:  # it expires on its own
                log.warning("clearing the consumer heartbeat failed: %s", err)

    def run(self, stopping: threading.Event) -> None:
        while True:
            self.beat_once()
            if stopping.wait(self._interval_s):
                # What was counted since the last beat (the record itself is cleared).
                self.pickups.flush(list(self._clusters()), now_ms(self._clock))
                return

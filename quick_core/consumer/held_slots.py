"""Concurrency slots held by items leased to remote workers: their app's pool-wide
``max_concurrency``, their tenant's ``max_running`` and their job type's
``pool_max_concurrency`` (issue 31 point 2 and issue 40 point 7 for ``quick serve``'s pull
leases), and the slots of the named limits their job types name (issue 45 point 2).

A local consumer's item keeps its slots (:mod:`quickzones.consumer.fetcher`) until its
handler ends, and its lease extender keeps them from lapsing. A remote worker's
item runs on another machine, so the server keeps them for it: taken by the pull
leaser's visit, kept while the item's lease lasts (extended with it), and given back when
its completion, failure or nack arrives (the settler's ``ended`` hook), or when its lease
lapses (a remote worker that vanished). While the server runs it refreshes the slots it
holds; a server that stops refreshing them lets them lapse after the slots' TTL, as a
stopped consumer's do.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from quickzones.clock import Clock, now_ms
from quickzones.consumer.slots import Slots
from quickzones.store.limits import SlotName
from quickzones.store.records import ZoneId

REFRESH_EVERY_S = 2.0  # well inside the slots' TTL (at least 10 s)

# (scope, name) of each slot an item holds: a name once per slot (a run of cost 2 holds 2)
Names = tuple[tuple[str, SlotName], ...]


class HeldSlots:
    """The slots each leased item holds, by (zone, item id)."""

    def __init__(self, slots: Slots, clock: Clock) -> None:
        self.slots = slots
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[tuple[ZoneId, str], tuple[Names, int]] = {}
        self._tidied = time.monotonic()

    def hold(self, zone: ZoneId, item_id: str, names: Names, until_ms: int) -> None:
        """``item_id`` was leased until ``until_ms`` holding a slot of each of ``names``
        (a lease of an item still held here lapsed: its slots are given back)."""
        with self._lock:
            old = self._held.pop((zone, item_id), None)
            if names:
                self._held[(zone, item_id)] = (names, until_ms)
        if old is not None:
            self.release(old[0])

    def add(self, zone: ZoneId, item_id: str, names: Names, until_ms: int) -> None:
        """``item_id``, leased until ``until_ms``, holds a slot of each of ``names`` too."""
        with self._lock:
            found = self._held.get((zone, item_id))
            held = names if found is None else found[0] + names
            self._held[(zone, item_id)] = (held, until_ms)

    def extended(self, zone: ZoneId, item_id: str, until_ms: int) -> None:
        with self._lock:
            found = self._held.get((zone, item_id))
            if found is not None:
                self._held[(zone, item_id)] = (found[0], until_ms)
        self.tidy()

    def ended(self, zone: ZoneId, item_id: str) -> None:
        """Its lease holder completed, failed or gave it back (or it was cancelled)."""
        with self._lock:
            found = self._held.pop((zone, item_id), None)
        if found is not None:
            self.release(found[0])

    def tidy(self) -> None:
        """At most every REFRESH_EVERY_S: give back the slots of lapsed leases and keep
        the others' from lapsing."""
        now = time.monotonic()
        with self._lock:
            if now - self._tidied < REFRESH_EVERY_S:
                return
            self._tidied = now
            at = now_ms(self.clock)
            lapsed = [k for k, (_, until) in self._held.items() if until <= at]
            names = [self._held.pop(k)[0] for k in lapsed]
        for held in names:
            self.release(held)
        self.slots.refresh_once()

    def release(self, names: Names) -> None:
        """Give back slots no item here holds (or holds no longer)."""
        for (scope, name), n in Counter(names).items():
            self.slots.release(scope, name, n)

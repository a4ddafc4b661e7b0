"""Waking a zone held back at its tenant's concurrency cap (issue 31 point 2) when one of
the tenant's items ends on this consumer.

A visit that finds a tenant's ``max_running`` full, or fills it, requeues the zone's
pointer ``RECHECK_MS`` ahead (:mod:`quickzones.consumer.tenant_admission`): nothing tells
a consumer when a slot frees on another one. When it frees here, this consumer knows: the
item that held it has just ended. So the zone waits here, by the slot's name, and the end
pulls its pointer to now (the two-part enqueue's part two,
:meth:`~quickzones.store.toplevel.TopLevelQueue.pull_pointer_earlier`: one small
transaction, and a pointer leased meanwhile is left to its visit) and wakes the scanner.
Without it a tenant capped at 2 ran 2 items per ``RECHECK_MS``, however short they were.

An item may end between the visit's slot count and its pointer's requeue: the ends are
counted by name, and a zone whose count moved since is woken as soon as it is requeued.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from quickzones.clock import Clock, now_ms
from quickzones.store.limits import SlotName
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import TopLevelQueue

Name = tuple[str, ...]


class CapWake:
    """The zones this consumer held back at a tenant's cap, woken when a slot frees here."""

    def __init__(self, clock: Clock, wake_scanner: Callable[[], None]) -> None:
        self.clock = clock
        self.wake_scanner = wake_scanner
        self._lock = threading.Lock()
        self._ended: Counter[Name] = Counter()  # items ended here, by slot name
        self._waiting: dict[Name, dict[ZoneId, TopLevelQueue]] = {}

    def seen(self, name: Name) -> int:
        """The count of ``name``'s ends, read before its slots are counted."""
        with self._lock:
            return self._ended[name]

    def wait(self, name: Name, seen: int, toplevel: TopLevelQueue, zone: ZoneId) -> None:
        """``zone``'s pointer was requeued for ``name``'s cap: wake it at the next end,
        or now if one came since ``seen``."""
        with self._lock:
            if self._ended[name] == seen:
                self._waiting.setdefault(name, {})[zone] = toplevel
                return
        self._wake({zone: toplevel})

    def ended(self, scope: str, name: SlotName) -> None:
        """An item holding one of ``name``'s slots ended here (its slot is released)."""
        if scope != "tenant" or isinstance(name, str):
            return
        with self._lock:
            self._ended[name] += 1
            waiting = self._waiting.pop(name, None)
        if waiting:
            self._wake(waiting)

    def _wake(self, zones: dict[ZoneId, TopLevelQueue]) -> None:
        for zone, toplevel in zones.items():
            toplevel.pull_pointer_earlier(zone, now_ms(self.clock))  # best effort
        self.wake_scanner()

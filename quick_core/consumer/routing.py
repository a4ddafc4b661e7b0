"""Routing: which zones and items a consumer takes (beyond the paper).

A consumer may be limited to some apps (``ConsumerConfig.apps``) and some job types
(``ConsumerConfig.job_types``); a job type with no handler registered is never its own.

- **Apps**: a pointer record names its zone, so a manager reads it before leasing and
  leaves a pointer of another app alone (``ZoneLeaseFailed("not_routed")``, nothing
  written); the scanner then skips that pointer id for a while, so the consumer does not
  read it on every scan. Local zones (the top-level queue's own items) are every
  consumer's.
- **Job types**: an item of a type this consumer does not handle is left in its zone at
  dequeue (never leased, so no attempt is counted and another consumer takes it at
  once), counted as the event ``unknown_job_type`` (a metric) and logged once per type.
  Only once it has been due for ``unhandled_grace_s`` (a rolling deploy that adds a type
  has finished by then) is it leased, and then dead-lettered with the reason. ``None``:
  never dead-lettered for want of a handler.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.errors import ConfigurationError
from quickzones.registry import JobType, Registry
from quickzones.store.keys import LOCAL_APP
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef

log = logging.getLogger("quick.consumer")

# A pointer of another app is skipped by the scanner this long after a manager saw it.
FOREIGN_POINTER_TTL_S = 60.0
_MAX_FOREIGN = 100_000


class Router:
    """Decides which zones and items a consumer takes; shared by its threads."""

    def __init__(
        self,
        config: ConsumerConfig,
        registry: Registry,
        clock: Clock,
        emit: Callable[..., Any],
    ) -> None:
        self.config = config
        self.registry = registry
        self.clock = clock
        self.emit = emit
        self.apps = None if config.apps is None else frozenset(config.apps)
        self.types = None if config.job_types is None else frozenset(config.job_types)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._foreign: dict[tuple[str, int, str], float] = {}  # pointer -> skip until (s)
        # Items admitted past their grace, to be dead-lettered by the worker.
        self._expired: set[str] = set()

    def check(self) -> None:
        """Every routed job type must have a handler here (a typo would route nothing)."""
        if self.types is None:
            return
        missing = sorted(t for t in self.types if self.registry.find(t) is None)
        if missing:
            raise ConfigurationError(
                f"job types {', '.join(map(repr, missing))} given to route to this consumer "
                f"have no handler; registered: {', '.join(self.registry.names()) or 'none'}"
            )

    @property
    def routed(self) -> bool:
        return self.apps is not None or self.types is not None

    # --- zones ---------------------------------------------------------------------------

    def takes_zone(self, zone: ZoneId) -> bool:
        return self.apps is None or zone.app == LOCAL_APP or zone.app in self.apps

    def takes_pointer(self, ref: PointerRef, zone: ZoneId) -> bool:
        """For the manager, before leasing: False (and remembered) for another app's."""
        if self.takes_zone(zone):
            return True
        with self._lock:
            if len(self._foreign) >= _MAX_FOREIGN:
                self._foreign.clear()
            self._foreign[(ref.cluster, ref.shard, ref.pointer_id)] = (
                self.clock.now() + FOREIGN_POINTER_TTL_S
            )
        return False

    def skips(self, ref: PointerRef) -> bool:
        """For the scanner: a pointer a manager recently found to be another app's."""
        if self.apps is None:
            return False
        key = (ref.cluster, ref.shard, ref.pointer_id)
        with self._lock:
            until = self._foreign.get(key)
            if until is None:
                return False
            if self.clock.now() < until:
                return True
            del self._foreign[key]
            return False

    # --- items ---------------------------------------------------------------------------

    def job_for(self, job_type: str) -> JobType | None:
        """The job type's handler if this consumer runs it, else None."""
        if self.types is not None and job_type not in self.types:
            return None
        return self.registry.find(job_type)

    def admit(self, item: WorkItem) -> bool:
        """At dequeue: take an item this consumer handles; leave any other vested in its
        zone (counted, logged once per type) until it has been due for the grace."""
        if self.job_for(item.job_type) is not None:
            return True
        self.report(item, None)
        grace = self.config.unhandled_grace_s
        # A vested, unleased item's vesting time is when it became due.
        if grace is not None and now_ms(self.clock) - item.vesting_ms >= grace * 1000:
            with self._lock:
                self._expired.add(item.item_id)
            return True
        return False

    def accept(self, inner: Callable[[WorkItem], bool]) -> Callable[[WorkItem], bool]:
        """Compose with the manager's admission predicate (concurrency caps)."""
        return lambda item: self.admit(item) and inner(item)

    def expired(self, item_id: str) -> bool:
        """Whether this item was admitted to be dead-lettered (forgets it)."""
        with self._lock:
            if item_id in self._expired:
                self._expired.discard(item_id)
                return True
            return False

    def report(self, item: WorkItem, zone: ZoneId | None) -> None:
        """Every time as the event ``unknown_job_type``; once per type at WARNING."""
        job_type = item.job_type
        with self._lock:
            first = job_type not in self._warned
            self._warned.add(job_type)
        self.emit("unknown_job_type", zone=zone, item_id=item.item_id, job_type=job_type)
        if first:
            grace = self.config.unhandled_grace_s
            handled = sorted(self.types) if self.types is not None else self.registry.names()
            log.warning(
                "job type %r (item %s%s) is not handled by this consumer: its items are "
                "left for a consumer that handles it%s; this one handles: %s",
                job_type,
                item.item_id,
                "" if zone is None else f" in {zone}",
                " (no attempt counted)"
                if grace is None
                else f", and dead-lettered once due for {grace:g}s",
                ", ".join(handled) or "none",
            )

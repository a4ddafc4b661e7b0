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
  once), counted as the event ``unknown_job_type`` (a metric) and logged once per type
  at WARNING. A consumer never settles such an item (dead letter, retry, completion):
  it cannot know that no other consumer runs the type, and a worker started with the
  wrong module dead-lettered other apps' items that way (issue 41 point 3). One leased
  anyway is given back, its attempt not counted. Once one has been due for
  ``unhandled_grace_s`` (a rolling deploy that adds a type has finished by then), that is
  logged once per type at ERROR, so an operator deploys its handler or cancels it.
  ``None``: never reported.
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


def serves_app(apps: frozenset[str] | tuple[str, ...] | None, zone: ZoneId) -> bool:
    """Whether a consumer routed to ``apps`` (None: every app) takes ``zone``'s pointers:
    the manager's check before leasing, and ``quick explain``'s over the live consumers'
    heartbeats."""
    return apps is None or zone.app == LOCAL_APP or zone.app in apps


def serves_type(types: frozenset[str] | tuple[str, ...] | None, job_type: str) -> bool:
    """Whether a consumer routed to ``types`` (None: every type it has a handler for)
    takes items of ``job_type`` at dequeue."""
    return types is None or job_type in types


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
        self._overdue: set[str] = set()  # types reported past their grace
        self._foreign: dict[tuple[str, int, str], float] = {}  # pointer -> skip until (s)

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
        return serves_app(self.apps, zone)

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
        if not serves_type(self.types, job_type):
            return None
        return self.registry.find(job_type)

    def admit(self, item: WorkItem) -> bool:
        """At dequeue: take an item this consumer handles; leave any other vested in its
        zone (counted, logged once per type), however long it has waited."""
        if self.job_for(item.job_type) is not None:
            return True
        self.report(item, None)
        return False

    def accept(self, inner: Callable[[WorkItem], bool]) -> Callable[[WorkItem], bool]:
        """Compose with the manager's admission predicate (concurrency caps)."""
        return lambda item: self.admit(item) and inner(item)

    def report(self, item: WorkItem, zone: ZoneId | None) -> None:
        """Every time as the event ``unknown_job_type``; once per type at WARNING, and
        once per type at ERROR when one has been due for the grace."""
        job_type = item.job_type
        grace = self.config.unhandled_grace_s
        # A vested item's vesting time is when it became due (a leased one's is later).
        overdue = grace is not None and now_ms(self.clock) - item.vesting_ms >= grace * 1000
        with self._lock:
            first = job_type not in self._warned
            self._warned.add(job_type)
            first_overdue = overdue and job_type not in self._overdue
            if overdue:
                self._overdue.add(job_type)
        self.emit("unknown_job_type", zone=zone, item_id=item.item_id, job_type=job_type)
        where = "" if zone is None else f" in {zone}"
        handled = sorted(self.types) if self.types is not None else self.registry.names()
        if first:
            log.warning(
                "job type %r (item %s%s) is not handled by this consumer: its items are "
                "left for a consumer that handles it, never settled here (no attempt "
                "counted); this one handles: %s",
                job_type, item.item_id, where, ", ".join(handled) or "none",
            )  # fmt: skip
        if first_overdue:
            log.error(
                "job type %r: item %s%s has been due for %gs or more and this consumer "
                "cannot run it (it handles: %s); it stays queued until a consumer with its "
                "handler runs it: deploy one, or cancel the item",
                job_type, item.item_id, where, grace, ", ".join(handled) or "none",
            )  # fmt: skip

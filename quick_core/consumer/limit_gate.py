"""Named limits at a run's start (issue 45 point 2; :mod:`quickzones.store.named_limits`):
the slots a Worker (Algorithm 3) takes of each limit its job type names, held while
the handler runs, as a job type's ``pool_max_concurrency`` slot is.

A run of ``cost`` n takes n slots of each limit, all or none (:meth:`Limits.acquire_slots`
with ``whole``), the tenant's share first, then the total, then the rate's starts. When a
limit is full the worker waits a short while (``ConsumerConfig.limit_wait_s``, 1 s) for a
slot: woken at once when one frees on this consumer, and looking again each
:data:`POLL_S` for one freed on another. So a slot freed anywhere is taken again within a
poll, and a limit of 5 runs 5 (a worker that gave its item back at once left the slot idle
until the item's next visit). Past the wait the item is given back unstarted, counting no
attempt, to be leased again after :data:`RETRY_MS`: no worker is held long by a limit
others fill.

``quick serve`` takes them with the same gate for the items it leases to remote workers
(:mod:`~quickzones.consumer.pull_leaser`), without waiting (``wait_s`` 0: a full limit
gives the item back at once), holding them until the item's outcome arrives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from quickzones.clock import Clock, now_ms
from quickzones.consumer.slots import Slots
from quickzones.errors import InvalidArgument, StorageError
from quickzones.store.limits import Limits
from quickzones.store.named_limits import (
    SCOPE,
    Limit,
    NamedLimits,
    check_cost,
    check_limit_name,
)
from quickzones.store.records import ZoneId

log = logging.getLogger("quick.consumer")

POLL_S = 0.02  # how often a waiting worker looks for a slot freed on another consumer
RETRY_MS = 250  # an item given back at a full limit is leased again this much later
MISSING_RETRY_MS = 2_000  # an item whose limit is not defined: looked at again this late

Name = tuple[str, ...]


class Limited(Protocol):
    """What the gate reads of a job type: a registered :class:`JobType`, or the limits a
    remote worker's lease request names for one (:class:`LimitRefs`)."""

    @property
    def name(self) -> str: ...

    @property
    def limits(self) -> tuple[str, ...]: ...

    @property
    def cost(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LimitRefs:
    """A job type's named limits and cost, as a remote worker's lease request sends them
    (the server has no handlers)."""

    name: str
    limits: tuple[str, ...]
    cost: int = 1

    @staticmethod
    def of(name: str, limits: list[str], cost: int = 1) -> LimitRefs:
        """Checked: distinct limit names, a cost from 1 (:class:`InvalidArgument` else)."""
        names = tuple(check_limit_name(n) for n in limits)
        if not names or len(set(names)) != len(names):
            raise InvalidArgument("limits", limits, f"job type {name!r}: name each limit once")
        return LimitRefs(name, names, check_cost(cost))


@dataclass(slots=True)
class Taken:
    """What one run took of its limits: slots by name, and rate starts granted."""

    slots: list[tuple[Name, int]] = field(default_factory=list)
    starts: list[tuple[Limit, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a run may not start now, and how long until it is worth trying again (ms)."""

    reason: str
    retry_ms: int
    wait: bool = True  # a slot may free soon: worth waiting for here


class LimitGate:
    """A consumer's enforcement of named limits (one per Worker)."""

    def __init__(
        self,
        slots: Slots,
        limits: Limits | None,
        clock: Clock,
        emit: Callable[..., Any],
        stopping: threading.Event,
        wait_s: float = 1.0,
    ) -> None:
        self.slots = slots
        self.wait_s = wait_s
        self.kv_limits = limits
        self.clock = clock
        self.emit = emit
        self.stopping = stopping
        self.named: NamedLimits | None = None  # set by Quick.consumer: the store's
        self._freed = threading.Condition()
        self._releases = 0  # slots released here so far: a waiter that saw fewer looks again
        self._warned: set[tuple[str, str, str]] = set()

    def limits_of(self, zone: ZoneId, job: Limited) -> list[Limit] | Refused:
        """The limits ``job`` names in ``zone``'s app, or why it cannot run under them
        (a name the app does not define, a cost no limit of it can ever grant)."""
        assert self.named is not None
        defined = self.named.of_app(zone.app)
        found = []
        for name in job.limits:
            limit = defined.get(name)
            if limit is None:
                return self._misconfigured(
                    zone,
                    job,
                    name,
                    f"job type {job.name!r} names limit {name!r}, which app {zone.app!r} "
                    f"does not define (quick limits set {name} --app {zone.app} ...); its "
                    f"items wait",
                )
            most = limit.most()
            if most is not None and job.cost > most:
                return self._misconfigured(
                    zone,
                    job,
                    name,
                    f"job type {job.name!r} costs {job.cost} slots, more than limit "
                    f"{name!r} of app {zone.app!r} ever grants ({most}); its items wait",
                )
            found.append(limit)
        return found

    def _misconfigured(self, zone: ZoneId, job: Limited, name: str, text: str) -> Refused:
        key = (zone.app, job.name, name)
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)
        return Refused(text, MISSING_RETRY_MS, wait=False)

    def take(self, zone: ZoneId, job: Limited) -> Taken | Refused:
        """Take ``job.cost`` slots of each limit ``job`` names for a run in ``zone``,
        waiting up to ``wait_s`` for a full one; what to release when the run ends,
        or why it may not start (nothing held then)."""
        if not job.limits or self.named is None or self.kv_limits is None:
            return Taken()
        until = time.monotonic() + self.wait_s
        while True:
            seen = self._releases  # a release between a refusal and the wait still wakes it
            # Each look takes the limits as now cached (a dict read until a refresh is
            # due): a worker that waited under the limits read at its start granted under
            # a lowered one for the rest of its wait.
            try:
                limits = self.limits_of(zone, job)
            except StorageError as err:
                self.emit("limits_error", zone=zone, error=str(err))
                return Refused(f"limits unreadable: {err}", RETRY_MS, wait=False)
            if isinstance(limits, Refused):
                return limits
            got = self._take_once(zone, job, limits)
            if isinstance(got, Taken) or not got.wait:
                return got
            left = until - time.monotonic()
            if left <= 0 or self.stopping.is_set():
                return got
            with self._freed:
                if self._releases == seen:
                    self._freed.wait(min(left, POLL_S, max(0.001, got.retry_ms / 1000)))

    def _take_once(self, zone: ZoneId, job: Limited, limits: list[Limit]) -> Taken | Refused:
        assert self.kv_limits is not None
        taken = Taken()
        try:
            for limit in limits:
                for name, cap in (
                    (limit.tenant_name(zone.tenant), limit.per_tenant),
                    (limit.total_name(), limit.concurrency),
                ):
                    if cap is None:
                        continue
                    if not self.slots.acquire(SCOPE, name, job.cost, cap, whole=True):
                        self._undo(taken)
                        who = "tenant " + zone.tenant + "'s share" if len(name) == 3 else "total"
                        return Refused(f"limit {limit.name} full ({who} of {cap})", RETRY_MS)
                    taken.slots.append((name, job.cost))
                if limit.rate is not None:
                    name = limit.total_name()
                    granted, next_ms = self.kv_limits.grant_starts(
                        name, job.cost, limit.rate, limit.per_ms
                    )
                    if granted:
                        taken.starts.append((limit, granted))
                    if granted < job.cost:
                        self._undo(taken)
                        wait_ms = max(1, next_ms - now_ms(self.clock))
                        return Refused(f"limit {limit.name} rate", wait_ms)
        except StorageError as err:
            self._undo(taken)
            self.emit("limits_error", zone=zone, error=str(err))
            return Refused(f"limits unreadable: {err}", RETRY_MS, wait=False)
        return taken

    def release(self, taken: Taken) -> None:
        """Give back what a run took (its handler ended, or it never started), and wake
        the workers waiting here for a slot."""
        for name, n in taken.slots:
            self.slots.release(SCOPE, name, n)
        if taken.slots:
            taken.slots.clear()
            with self._freed:
                self._releases += 1
                self._freed.notify_all()

    def _undo(self, taken: Taken) -> None:
        """Give back all a refused run took: its slots and its rate starts."""
        self.release(taken)
        assert self.kv_limits is not None
        for limit, n in taken.starts:
            try:
                assert limit.rate is not None
                self.kv_limits.refund_starts(limit.total_name(), n, limit.rate, limit.per_ms)
            except StorageError:
                pass  # an unrefunded start only delays the next
        taken.starts.clear()

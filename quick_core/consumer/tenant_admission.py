"""Per-tenant limits at a visit (issue 31 point 2; :mod:`quickzones.store.tenant_limits`):
how many items of a leased zone its tenant's limits let the visit take.

Enforced where the app's limits are (:meth:`Manager.apply_app_limits`), through the same
store: a tenant's ``max_running`` is slots in :class:`~quickzones.store.limits.Limits`
(scope ``"tenant"``, named (app, tenant) or (app, tenant, job type)), taken for the room
before the dequeue, kept by each item until its handler ends, and refreshed by the lease
extender like every other slot; ``rate`` is granted by
:meth:`~quickzones.store.limits.Limits.grant_starts`. What the dequeue does not use is
given back at once. Only one consumer visits a zone at a time (its pointer lease), so a
visit's slots taken ahead of the dequeue hold no other consumer back.

What the limits hold back stays vested, counts no attempt, and the zone's pointer is
requeued no earlier than when a start may be allowed (the next evenly spaced start, or
``RECHECK_MS`` for a concurrency cap that the visit found or left full): never visited in
a loop, and no other tenant waits. A cap's ``RECHECK_MS`` is the fallback for slots that
free on other consumers: when one of the tenant's items ends on this one, the zone is
woken at once (:mod:`quickzones.consumer.cap_wake`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.cap_wake import CapWake
from quickzones.consumer.slots import Slots
from quickzones.errors import StorageError
from quickzones.store.limits import Limits
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.tenant_limits import TenantLimit, TenantLimits
from quickzones.store.toplevel import TopLevelQueue

SCOPE = "tenant"  # the slots' scope in Limits
# A zone held at a concurrency cap is looked at again this soon: a slot frees when one of
# its items ends, on any consumer, and only an end on this one tells it (CapWake).
RECHECK_MS = 250

Name = tuple[str, ...]


@dataclass(slots=True)
class TenantHold:
    """What one zone's visit took of its tenant's limits."""

    slots: dict[Name, int] = field(default_factory=dict)  # slots taken, by limit name
    starts: dict[Name, tuple[int, TenantLimit]] = field(default_factory=dict)  # granted
    budget: dict[str, int] = field(default_factory=dict)  # a limited job type's room
    taken: dict[str, str] = field(default_factory=dict)  # item id -> job type, admitted
    type_recheck_ms: int = 0  # when a job type held back may be allowed again
    held_back: bool = False  # the dequeue left an item of a limited job type
    capped: dict[Name, int] = field(default_factory=dict)  # caps found full: ends seen
    full_recheck_ms: int = 0  # the tenant's cap was filled: look again then, or when woken
    next_start_ms: int = 0  # the tenant's start rate: its next slot (0: no rate)

    def not_before(
        self, not_before: int | None, took: int, room: int, horizon_ms: int = 0
    ) -> int | None:
        """When the zone's pointer may vest again after a dequeue that took ``took`` of
        ``room``: only items of a job type at its tenant's limit left (as paused ones), or
        the tenant's cap filled by this visit (its pointer waits for a wake), or the
        tenant's next start slot (nothing of it may start before).

        ``horizon_ms``: how far ahead of a pointer's vesting the visiting consumer's
        scans lease it (its timer look-ahead): each time is moved that much later, so
        the zone is visited at it, not before. A visit ahead of a rate's slot could start
        nothing and requeued the pointer again (issue 41 point 11: about 3 visits a
        start)."""
        wait = 0
        if self.held_back and took < room:
            wait = max(wait, self.type_recheck_ms)
        if self.full_recheck_ms and took >= room:
            wait = max(wait, self.full_recheck_ms)
        wait = max(wait, self.next_start_ms)
        if not wait:
            return not_before
        return max(not_before or 0, wait + horizon_ms)

    def accept(self, inner: Callable[[WorkItem], bool] | None) -> Callable[[WorkItem], bool] | None:
        """``inner`` with each limited job type cut to its room. Retried dequeue tries
        see an item again: it is counted once (by id)."""
        if not self.budget:
            return inner

        def accept(item: WorkItem) -> bool:
            room = self.budget.get(item.job_type)
            if room is not None and item.item_id not in self.taken:
                used = sum(1 for t in self.taken.values() if t == item.job_type)
                if used >= room:
                    self.held_back = True
                    return False
            if inner is not None and not inner(item):
                return False
            if room is not None:
                self.taken[item.item_id] = item.job_type
            return True

        return accept


class TenantAdmission:
    """A consumer's enforcement of per-tenant limits (one per Manager)."""

    def __init__(
        self,
        limits: Limits | None,
        slots: Slots,
        clock: Clock,
        emit: Callable[..., Any],
        wake_scanner: Callable[[], None] = lambda: None,
    ) -> None:
        self.kv_limits = limits  # slots and start grants
        self.slots = slots
        self.clock = clock
        self.emit = emit
        self.wake = CapWake(clock, wake_scanner)  # zones held at a cap, woken by an end
        slots.watchers.append(self.wake.ended)
        self.limits: TenantLimits | None = None  # set by Quick.consumer: the store's

    def of(self, zone: ZoneId) -> tuple[TenantLimit, ...]:
        """``zone``'s tenant's limits, looked up and cached
        (:mod:`quickzones.store.meta_sets`): nothing read for a zone of an app whose
        tenants have none. While the store cannot be read, the last ones read; when
        there are none, the error is raised: visiting would take items as if the tenant
        had no limit, so the visit fails instead and the scanner backs off."""
        if self.limits is None or self.kv_limits is None:
            return ()
        try:
            return self.limits.of_zone(zone)
        except StorageError as err:
            self.emit("limits_error", zone=zone, error=str(err))
            found = self.limits.last_of(zone)
            if found is None:
                raise
            return found

    def limit(self, zone: ZoneId, room: int) -> tuple[int, int | None, TenantHold | None]:
        """A visit's ``room`` for ``zone`` cut to its tenant's limits (:meth:`of`): (room,
        not_before_ms or None, the hold to :meth:`settle` after the dequeue, None when no
        limit applies). The visits of a consumer's Manager and of
        ``quick serve``'s pull leaser both take it; a store that cannot be read gives no
        room (nothing is taken)."""
        limits = self.of(zone)
        if not limits or room <= 0 or self.kv_limits is None:
            return room, None, None
        try:
            return self.admit(zone, room, limits)
        except StorageError as err:
            self.emit("limits_error", zone=zone, error=str(err))
            return 0, None, None

    def admit(
        self, zone: ZoneId, room: int, limits: Sequence[TenantLimit]
    ) -> tuple[int, int | None, TenantHold]:
        """Cut ``room`` to the tenant-wide limit and give each limited job type its room;
        returns (room, not_before_ms or None, the hold to settle after the dequeue)."""
        assert self.kv_limits is not None
        hold = TenantHold()
        not_before: int | None = None
        # The tenant-wide limit first: a job type's room is within the tenant's.
        for limit in sorted(limits, key=lambda lim: lim.job_type is not None):
            name = limit.name()
            n = room
            wait: int | None = None
            if limit.max_running is not None and n > 0:
                seen, wanted = self.wake.seen(name), n
                n = self.slots.acquire(SCOPE, name, n, limit.max_running)
                hold.slots[name] = n
                if n < wanted:  # the cap is full now: wait for a wake (CapWake)
                    hold.capped[name] = seen
                if n == 0:
                    wait = now_ms(self.clock) + RECHECK_MS
                    self.emit("throttled", zone=zone, reason="tenant concurrency cap")
                elif n < wanted and limit.job_type is None:
                    hold.full_recheck_ms = now_ms(self.clock) + RECHECK_MS
            if limit.rate is not None and n > 0:
                granted, next_ms = self.kv_limits.grant_starts(name, n, limit.rate, limit.per_ms)
                if limit.job_type is None:
                    # Nothing of the tenant starts before its next slot, whatever this
                    # visit took: its pointer waits for it (TenantHold.not_before).
                    hold.next_start_ms = next_ms
                if granted < n:
                    if limit.job_type is not None:
                        wait = next_ms
                    hold.capped.pop(name, None)  # the rate holds it, not the cap
                    if limit.job_type is None:
                        hold.full_recheck_ms = 0
                    self.emit("throttled", zone=zone, reason="tenant start rate")
                    if name in hold.slots:
                        self.slots.release(SCOPE, name, n - granted)
                        hold.slots[name] = granted
                    n = granted
                hold.starts[name] = (granted, limit)
            if limit.job_type is None:
                room = n
                if wait is not None:
                    not_before = wait if not_before is None else max(not_before, wait)
            else:
                hold.budget[limit.job_type] = n
                if wait is not None:
                    hold.type_recheck_ms = max(hold.type_recheck_ms, wait)
        return room, not_before, hold

    def settle(self, zone: ZoneId, hold: TenantHold, items: Sequence[WorkItem]) -> list[Name]:
        """Give back what the dequeue did not use; returns the slot names each of the
        ``items`` holds until its handler ends (the same for every item of a type)."""
        by_type = Counter(item.job_type for item in items)

        def used(name: Name) -> int:
            return len(items) if len(name) == 2 else by_type[name[2]]

        try:
            for name, got in hold.slots.items():
                if got > used(name):
                    self.slots.release(SCOPE, name, got - used(name))
            for name, (granted, limit) in hold.starts.items():
                if granted > used(name):
                    assert self.kv_limits is not None and limit.rate is not None
                    self.kv_limits.refund_starts(
                        name, granted - used(name), limit.rate, limit.per_ms
                    )
        except StorageError as err:
            # Slots lapse after their TTL; an unrefunded start only delays the next.
            self.emit("limits_error", zone=zone, error=str(err))
        return [name for name, got in hold.slots.items() if got]

    def requeued(self, toplevel: TopLevelQueue, zone: ZoneId, hold: TenantHold | None) -> None:
        """``zone``'s pointer was requeued after a visit: if a cap held it back, it waits
        for the next end of one of the tenant's items here."""
        for name, seen in ({} if hold is None else hold.capped).items():
            self.wake.wait(name, seen, toplevel, zone)


def slots_of(item: WorkItem, held: Sequence[Name]) -> tuple[Name, ...]:
    """The tenant slots ``item`` holds of those a visit kept: the tenant's, and its job
    type's."""
    return tuple(name for name in held if len(name) == 2 or name[2] == item.job_type)

"""What an item leased to a remote worker takes as its handler would start (issue 45
point 2 for ``quick serve``'s pull leases): the named limits its job type names (the
local Worker's own :class:`~quickzones.consumer.limit_gate.LimitGate`, ``cost`` slots of
each) and its type's pool-wide cap (:meth:`Fetcher.pool_slots`), in the order a Worker
takes them. The remote worker sends both with its lease request. What an item took is
kept by :class:`~quickzones.consumer.held_slots.HeldSlots` until its outcome arrives, its
lease lapses or it is found cancelled.

The gate does not wait here (``wait_s`` 0): a lease call holds no thread for a slot
another run frees. An item a limit or cap refuses is given back unstarted, no attempt
counted, due again when the limit says (a type's cap: 100 ms), as a Worker gives it back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from quickzones.clock import Clock
from quickzones.consumer.fetcher import TYPE_SCOPE, Fetcher
from quickzones.consumer.held_slots import HeldSlots, Names
from quickzones.consumer.limit_gate import LimitGate, LimitRefs, Refused
from quickzones.store.limits import Limits
from quickzones.store.named_limits import SCOPE, NamedLimits
from quickzones.store.records import WorkItem, ZoneId

TYPE_CAP_RETRY_MS = 100  # as a Worker gives back an item its type's cap holds back

GiveBack = Callable[[ZoneId, WorkItem, int], None]  # (zone, item, due again in ms)


class PullAdmission:
    """Named limits and pool-wide caps for one server's pull leases."""

    def __init__(
        self,
        fetcher: Fetcher,
        held: HeldSlots,
        limits: Limits,
        named: NamedLimits,
        clock: Clock,
        emit: Callable[..., Any],
        give_back: GiveBack,
    ) -> None:
        self.fetcher = fetcher
        self.held = held
        self.give_back = give_back
        self.gate = LimitGate(held.slots, limits, clock, emit, threading.Event(), 0.0)
        self.gate.named = named

    def admitted(
        self,
        zone: ZoneId,
        items: list[WorkItem],
        named_limits: Mapping[str, LimitRefs],
        pool_caps: Mapping[str, int],
    ) -> list[WorkItem]:
        """The items their job types' limits and caps let run; each keeps what it took."""
        kept = []
        for item in items:
            held: Names = ()
            job = named_limits.get(item.job_type)
            if job is not None:
                taken = self.gate.take(zone, job)
                if isinstance(taken, Refused):
                    self.give_back(zone, item, taken.retry_ms)
                    continue
                held = tuple((SCOPE, name) for name, n in taken.slots for _ in range(n))
            if item.job_type in pool_caps:
                if not self.fetcher.pool_slots([item], pool_caps)[0]:
                    self.held.release(held)
                    self.give_back(zone, item, TYPE_CAP_RETRY_MS)
                    continue
                held += ((TYPE_SCOPE, item.job_type),)
            if held:
                self.held.add(zone, item.item_id, held, item.vesting_ms)
            kept.append(item)
        return kept

"""The lease extender: keeps the item leases of held items alive, running or waiting.

A Worker (Algorithm 3) holds an item's lease while its handler runs; a lease lasts
``item_lease_s`` and the extender renews it when less than ``item_lease_s -
lease_extend_s`` is left. A lease that cannot be renewed (another consumer leased the
item, or it is gone) interrupts the handler with ``LeaseInterrupted``; a handler past its
job type's execution bound gets ``ExecutionBoundExceeded``. The extender also keeps this
consumer's pool-wide concurrency slots from lapsing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.interrupt import ExecutionBoundExceeded, LeaseInterrupted
from quickzones.consumer.item_ops import ItemOps
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import InFlight, Work
from quickzones.errors import ItemNotFound, LeaseLost, StorageError
from quickzones.store.flow_key_lapses import holds_run_lease

log = logging.getLogger("quick.consumer")

# How often running items are checked for a cancel (and leases for extension).
CANCEL_WATCH_S = 0.5


def extend_s(config: ConsumerConfig) -> float:
    """How often a running item's lease is renewed."""
    return config.lease_extend_s or config.item_lease_s / 3


def due_for_extension(config: ConsumerConfig, clock: Clock, work: Work) -> bool:
    remaining_ms = work.item.vesting_ms - now_ms(clock)
    return remaining_ms <= (config.item_lease_s - extend_s(config)) * 1000


class LeaseExtender:
    """Extends the leases of running items; interrupts the handlers that lost theirs."""

    def __init__(
        self,
        config: ConsumerConfig,
        ops: ItemOps,
        clock: Clock,
        in_flight: InFlight,
        slots: Slots,
        emit: Callable[..., Any],
    ) -> None:
        self.config = config
        self.ops = ops  # the held items' operations (zone store, or HTTP)
        self.clock = clock
        self.in_flight = in_flight
        self.slots = slots
        self.emit = emit

    def extend_once(self) -> None:
        """Extend the leases of held items near expiry, running or waiting for a worker;
        interrupt the handlers whose lease was lost or whose execution bound passed."""
        lease_ms = int(self.config.item_lease_s * 1000)
        for work in self.in_flight.waiting():
            # Held and not started (a prefetch beyond the free workers, or a worker slow
            # to take it): its lease is kept, so waiting never lets it lapse.
            if not due_for_extension(self.config, self.clock, work):
                continue
            try:
                renewed = self.ops.extend(work, lease_ms)
            except (LeaseLost, ItemNotFound):
                continue  # cancelled, or taken over: its worker's start check says so
            except StorageError as err:
                self.emit("extend_error", error=str(err))
                continue
            self.in_flight.renewed(work, renewed)
            self.emit("lease_extended", zone=work.zone, item_id=work.item.item_id)
        mono = time.monotonic()
        for r in self.in_flight.snapshot():
            if r.interrupted or r.done:
                continue
            if r.deadline is not None and mono > r.deadline:
                self.in_flight.interrupt(r, ExecutionBoundExceeded)
                continue
            if r.transactional:
                continue  # held by its worker for each transaction's life
            if r.work.started and not holds_run_lease(r.work.item):
                continue  # deleted already: nothing to renew
            if not due_for_extension(self.config, self.clock, r.work):
                continue
            try:
                r.work.item = self.ops.extend(r.work, lease_ms)
                self.emit("lease_extended", zone=r.work.zone, item_id=r.work.item.item_id)
            except ItemNotFound:
                if not r.work.cancelled.is_set():
                    # Cancelled: told first (ctx.cancelled); interrupted only if it still
                    # runs at the next try.
                    r.work.cancelled.set()
                    continue
                r.lease_lost.set()
                self.in_flight.interrupt(r, LeaseInterrupted)
            except LeaseLost:
                r.lease_lost.set()
                self.in_flight.interrupt(r, LeaseInterrupted)
            except StorageError as err:
                self.emit("extend_error", error=str(err))

    def watch_cancels_once(self) -> None:
        """Tell each running handler whose item was cancelled (``Quick.cancel`` deletes
        it): ``ctx.cancelled`` turns true, cooperatively (no interrupt), and its worker
        completes nothing. One call for all running items (a read each; one request for
        a remote worker)."""
        watched = [
            r.work
            for r in self.in_flight.snapshot()
            # An at-most-once item is deleted when it starts: not a cancel.
            if not (r.done or r.work.started or r.work.cancelled.is_set())
        ]
        if not watched:
            return
        try:
            gone = self.ops.gone_many(watched)
        except StorageError:
            return
        for work, went in zip(watched, gone, strict=True):
            if went:
                work.cancelled.set()
                self.emit("cancel_seen", zone=work.zone, item_id=work.item.item_id)

    def run(self, stopping: threading.Event) -> None:
        """The extender thread, until ``stopping``: a running handler hears of its item's
        cancel within ``CANCEL_WATCH_S``."""
        period = min(CANCEL_WATCH_S, extend_s(self.config) / 2)
        slots_every = min(1.0, extend_s(self.config) / 2)  # the slots' own pace, as before
        slots_due = time.monotonic() + slots_every
        while not stopping.wait(period):
            try:
                self.watch_cancels_once()
                self.extend_once()
                if time.monotonic() >= slots_due:
                    slots_due = time.monotonic() + slots_every
                    self.slots.refresh_once()
            except Exception:
                log.exception("lease extender failed")

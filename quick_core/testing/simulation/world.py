"""The state a simulation's parts share, and its bookkeeping: each violation reported
once, the trace that makes one seed one run, the model entry of each item."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import Work
from quickzones.consumer.election import LocalElection
from quickzones.store.keys import KeySpace
from quickzones.store.records import ZoneId
from quickzones.testing.simulation.model import (
    ABSENT,
    COMMITTED,
    MAYBE,
    ItemModel,
    SimConfig,
    SimConsumer,
    UserTxn,
    Violation,
)


class SimWorld:
    """The state of one run. :class:`~quickzones.testing.simulation.harness.Simulation`
    sets it up; its steps and checks, each a mixin of this class in a module of its own,
    read and update it."""

    cfg: SimConfig
    rng: random.Random
    # Half the enqueues are FIFO; a stream of its own (see Simulation.__init__).
    fifo_rng: random.Random
    clock: ManualClock
    store: Any
    q: Quick
    keys: KeySpace
    election: LocalElection
    items: dict[str, ItemModel]
    txns: list[UserTxn]
    aborted_txns: int
    consumers: list[SimConsumer]
    consumer_serial: int
    violations: list[Violation]
    _reported: set[tuple[str, str]]
    step_no: int
    trace: hashlib.blake2b
    executing: Work | None
    producing: bool
    depth: int
    busy: list[SimConsumer]
    last_commit_applied: bool
    in_order_rounds: int
    pointer_leased: dict[str, tuple[float, int]]
    vested_seen: dict[tuple[str, int], tuple[float, int]]
    _z_prefix: bytes
    _c_prefix: bytes
    _enqueue_no: int

    def _violate(self, kind: str, detail: str, *, about: str | None = None) -> None:
        # A broken state persists across full scans; report each (kind, subject) once.
        key = (kind, about if about is not None else detail)
        if key in self._reported:
            return
        self._reported.add(key)
        self.violations.append(Violation(self.step_no, kind, detail))

    def _log(self, text: str) -> None:
        self.trace.update(text.encode())
        self.trace.update(b"\n")

    def _add_item(self, item_id: str, zone: ZoneId, kind: str, state: str) -> None:
        if item_id in self.items:
            # Two attempts that produced the same id: only a retry of an idempotent
            # enqueue does that, and its first state that committed wins.
            cur = self.items[item_id]
            if cur.early:
                # A consumer saw it while its enqueue was still retrying (interleaved in a
                # commit): what the enqueue reports now is authoritative.
                cur.early = False
                cur.state = state
                if state == ABSENT:
                    self._violate("aborted_item_dequeued", f"{item_id} in {zone}")
            elif state == COMMITTED or (state == MAYBE and cur.state == ABSENT):
                cur.state = state
            return
        self.items[item_id] = ItemModel(
            item_id,
            zone,
            kind,
            state,
            self.keys.item_key(zone, item_id),
            self.keys.dead_letter_key(zone, item_id),
        )

    def _early(self, item_id: str, zone: ZoneId, job_type: str) -> ItemModel:
        """An item a consumer got before its producer's enqueue returned (the enqueue
        committed, then retried after commit_unknown_result with a step interleaved)."""
        self._add_item(item_id, zone, job_type, MAYBE)
        model = self.items[item_id]
        model.early = True
        return model

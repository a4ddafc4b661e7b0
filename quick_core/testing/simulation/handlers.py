"""The handlers of the simulation's four job types: each draws an outcome from the seed
and records in the model what ran, so the checker can compare it with the store."""

from __future__ import annotations

from typing import Any

from quickzones.clock import now_ms
from quickzones.errors import Nack, PermanentError, TransientError
from quickzones.registry import JobContext
from quickzones.store.kv import pack_i64
from quickzones.testing.simulation.model import ABSENT, ItemModel, effect_key
from quickzones.testing.simulation.world import SimWorld


class SimHandlers(SimWorld):
    """Handlers of ``sim_plain``, ``sim_tx``, ``sim_amo`` and ``sim_ttl``."""

    def _outcome(self) -> str:
        r = self.rng.random()
        if r < 0.10:
            return "transient"
        if r < 0.13:
            return "permanent"
        if r < 0.17:
            return "nack"
        return "ok"

    def _delivered(self, ctx: JobContext) -> ItemModel | None:
        model = self.items.get(ctx.item_id)
        if model is None:
            model = self._early(ctx.item_id, ctx.zone, ctx.item.job_type)
        if model.state == ABSENT:
            self._violate("aborted_item_ran", f"{ctx.item_id} in {ctx.zone} never committed")
        model.deliveries += 1
        return model

    def _raise(self, outcome: str) -> None:
        if outcome == "nack":
            raise Nack(delay_s=round(self.rng.uniform(0.0, 1.0), 3), meta={"nacked": True})
        if outcome == "transient":
            raise TransientError("simulated transient failure")
        if outcome == "permanent":
            raise PermanentError("simulated permanent failure")

    def _handle_plain(self, payload: Any, ctx: JobContext) -> None:
        model = self._delivered(ctx)
        outcome = self._outcome()
        self._log(f"  run {ctx.item_id} {outcome}")
        self._raise(outcome)
        if model is not None:
            model.successes += 1

    def _handle_ttl(self, payload: Any, ctx: JobContext) -> None:
        deadline = ctx.item.deadline_ms
        if deadline is None or now_ms(self.clock) > deadline:
            self._violate("ttl_ran_late", f"{ctx.item_id}: deadline {deadline}")
        self._handle_plain(payload, ctx)

    def _handle_tx(self, payload: Any, ctx: JobContext) -> None:
        self._delivered(ctx)
        outcome = self._outcome()
        self._log(f"  runtx {ctx.item_id} {outcome}")
        assert ctx.tr is not None
        # The effect is written before a failure on purpose: a failed handler's effect
        # must be rolled back with its transaction.
        ctx.tr.add(effect_key(ctx.item_id), pack_i64(1))
        self._raise(outcome)

    def _handle_amo(self, payload: Any, ctx: JobContext) -> None:
        model = self._delivered(ctx)
        if model is not None and model.deliveries > 1:
            self._violate("at_most_once_redelivered", f"{ctx.item_id} ran {model.deliveries}x")
        outcome = self._outcome()
        self._log(f"  runamo {ctx.item_id} {outcome}")
        self._raise(outcome)

"""The consumer steps of the simulation: each consumer's scan (Algorithm 1), visit
(Algorithm 2) and execute (Algorithm 3) run as separate steps, and its events feed the
model (who holds which item's lease)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quickzones.consumer import ConsumerConfig, Work
from quickzones.consumer.pull_leaser import PullLeaser
from quickzones.store.toplevel import PointerRef
from quickzones.testing.simulation.model import ABSENT, AMO, ItemModel, SimConsumer
from quickzones.testing.simulation.world import SimWorld


class ConsumerSteps(SimWorld):
    """Steps of the simulated consumers, and what their events tell the model."""

    # --- consumer events -----------------------------------------------------------------

    def _observer(self, sc: SimConsumer) -> Callable[[str, dict[str, Any]], None]:
        name = sc.consumer.name

        def observe(event: str, fields: dict[str, Any]) -> None:
            item_id = fields.get("item_id")
            self._log(f"  {name} {event} {item_id or ''}")
            if event == "pointer_leased":
                sc.leased_zones.append(fields["zone"])
            if event == "zone_held_passed_over":
                # Invariant 10 holds for it: the scan passed it over because this consumer
                # holds enough of its items (skip_held_zones_at), which will run.
                self.pointer_leased[fields["pointer_id"]] = (self.clock.now(), self.in_order_rounds)
            if not isinstance(item_id, str):
                return
            model = self.items.get(item_id)
            if model is None:
                return
            if event == "completed":
                self._on_completed(model)
            elif event in ("requeued", "dead_lettered", "released"):
                model.lease = None

        return observe

    def _on_completed(self, model: ItemModel) -> None:
        model.completed_event = True
        work = self.executing
        if model.kind == AMO:
            return
        if work is None or work.item.item_id != model.item_id:
            self._violate("completion_outside_execute", model.item_id)
            return
        # Invariant 4: only the holder of the newest lease handed out may complete.
        if model.lease is None or work.item.lease_id != model.lease:
            self._violate(
                "completed_by_non_holder",
                f"{model.item_id}: lease {work.item.lease_id} but current {model.lease}",
            )

    # --- consumers -----------------------------------------------------------------------

    def _new_consumer(self) -> SimConsumer:
        self.consumer_serial += 1
        name = f"c{self.consumer_serial}"
        # Every other consumer visits in batches of up to 3 zones per transaction (one
        # transaction per visit otherwise: the paper's three).
        batched = (self.cfg.seed + self.consumer_serial) % 2 == 1
        # Every third a pull consumer (issue 40: the paper's rules on every path): never
        # in the scanner election (quick serve stands in it for its remote workers).
        pull = (self.cfg.seed + self.consumer_serial) % 3 == 0
        config = ConsumerConfig(
            peek_max=50,
            selection_frac=0.5,
            selection_max=8,
            processing_bound=1000,
            dequeue_max=4,
            pointer_lease_s=1.0,
            min_inactive_s=3.0,
            item_lease_s=10.0,
            election_ttl_s=5.0,
            in_order=False if pull else None,
            seed=self.cfg.seed * 1000 + self.consumer_serial,
            one_transaction_visits=batched,
            visits_per_transaction=3 if batched else 1,
        )
        consumer = self.q.consumer(config, election=self.election, name=name)
        sc = SimConsumer(consumer, leaser=PullLeaser(self.q, config) if pull else None)
        consumer.observer = self._observer(sc)
        self.consumers.append(sc)
        return sc

    def _pick_consumer(self) -> SimConsumer | None:
        if not self.consumers:
            return None
        return self.consumers[self.rng.randrange(len(self.consumers))]

    def step_scan(self, sc: SimConsumer) -> str:
        if sc.leaser is not None:
            works = self.pull(sc)
            sc.works.extend(works)
            return f"pull {sc.consumer.name} {len(works)}"
        if sc.refs:
            return f"scan {sc.consumer.name} busy"
        in_order = sc.consumer.in_order
        sc.refs = sc.consumer.scan_once()
        sc.round_in_order = in_order and sc.consumer.capacity() >= 4 * max(1, len(sc.refs))
        if not sc.refs and sc.round_in_order:
            self.in_order_rounds += 1
        return f"scan {sc.consumer.name} {'o' if in_order else 'r'} {len(sc.refs)}"

    def _visit(self, sc: SimConsumer, refs: list[PointerRef]) -> list[Work]:
        sc.leased_zones.clear()
        works = sc.consumer.visit_many(refs)
        for zone in sc.leased_zones:
            pointer = self.q.toplevel.get_pointer(zone)  # gone if the visit collected it
            if pointer is not None:
                self.pointer_leased[pointer.pointer_id] = (self.clock.now(), self.in_order_rounds)
        return self._leased(works)

    def pull(self, sc: SimConsumer) -> list[Work]:
        """A pull lease of up to ``dequeue_max`` items (Algorithms 1 and 2 by the server's
        leaser), counted in flight by the consumer whose Worker runs them."""
        assert sc.leaser is not None
        config = sc.consumer.config
        leased = sc.leaser.lease_once(None, config.dequeue_max, config.item_lease_s)
        now = self.clock.now()
        works = [Work(x.zone, x.item, now, cluster=sc.leaser.cluster.name) for x in leased]
        sc.consumer.manager.settle({}, [w.item for w in works])
        return self._leased(works)

    def _leased(self, works: list[Work]) -> list[Work]:
        """The model's side of items leased: who holds each one's lease now."""
        for w in works:
            model = self.items.get(w.item.item_id)
            if model is None:
                model = self._early(w.item.item_id, w.zone, w.item.job_type)
            if model.state == ABSENT:
                self._violate("aborted_item_dequeued", w.item.item_id)
            model.lease = w.item.lease_id
        return works

    def step_visit(self, sc: SimConsumer) -> str:
        if not sc.refs:
            return f"visit {sc.consumer.name} idle"
        size = sc.consumer.config.visits_at_once()
        refs, sc.refs = sc.refs[:size], sc.refs[size:]
        works = self._visit(sc, refs)
        sc.works.extend(works)
        if not sc.refs and sc.round_in_order:
            self.in_order_rounds += 1
        return f"visit {sc.consumer.name} {','.join(r.pointer_id for r in refs)} {len(works)}"

    def _execute(self, sc: SimConsumer, work: Work) -> str:
        outer, self.executing = self.executing, work
        try:
            return sc.consumer.execute(work)
        finally:
            self.executing = outer

    def step_execute(self, sc: SimConsumer) -> str:
        if not sc.works:
            return f"execute {sc.consumer.name} idle"
        work = sc.works.pop(self.rng.randrange(len(sc.works)))
        outcome = self._execute(sc, work)
        return f"execute {sc.consumer.name} {work.item.item_id} {outcome}"

    def step_election(self, sc: SimConsumer) -> str:
        sc.consumer.refresh_election()
        return f"election {sc.consumer.name} {sc.consumer.in_order}"

    def step_crash(self) -> str:
        sc = self._pick_consumer()
        if sc is None:
            return "crash none"
        # Vanishes with its leases (items and in-order lease expire on their own).
        self.consumers.remove(sc)
        return f"crash {sc.consumer.name} works={len(sc.works)}"

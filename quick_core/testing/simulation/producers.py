"""The producer steps of the simulation: enqueues, batches, cancels, and user
transactions that enqueue beside their own writes (sometimes aborted on purpose)."""

from __future__ import annotations

from quickzones.errors import ItemNotFound
from quickzones.store.kv import KVError, KVTransaction
from quickzones.store.records import ZoneId
from quickzones.testing.simulation.model import (
    ABSENT,
    AMO,
    APPS,
    CANCELLED,
    COMMITTED,
    MAYBE,
    PLAIN,
    TENANTS,
    TTL,
    TX,
    UserTxn,
    user_key,
)
from quickzones.testing.simulation.world import SimWorld


class _Abort(Exception):
    """Raised by a producer to abort its own transaction on purpose."""


class ProducerSteps(SimWorld):
    """Steps that produce work, drawn from the seed."""

    def _pick_zone(self) -> ZoneId:
        return ZoneId(self.rng.choice(APPS), self.rng.choice(TENANTS))

    def _pick_kind(self) -> str:
        r = self.rng.random()
        return PLAIN if r < 0.45 else TX if r < 0.75 else AMO if r < 0.9 else TTL

    def _pick_delay(self) -> float:
        return 0.0 if self.rng.random() < 0.7 else round(self.rng.uniform(0.0, 5.0), 3)

    def _pick_fifo(self) -> bool:
        return self.fifo_rng.random() < 0.5

    def _payload(self) -> dict[str, int]:
        self._enqueue_no += 1
        return {"n": self._enqueue_no}

    def step_enqueue(self) -> str:
        zone, kind = self._pick_zone(), self._pick_kind()
        delay, priority = self._pick_delay(), self.rng.choice((0, 0, 0, 1, 2))
        try:
            item_id = self.q.enqueue(
                kind,
                self._payload(),
                app=zone.app,
                tenant=zone.tenant,
                delay=delay,
                priority=priority,
                fifo=self._pick_fifo(),
            )
        except KVError as err:
            # Not expected with unlimited retries, but then the item may or may not exist.
            return f"enqueue failed {err.code}"
        self._add_item(item_id, zone, kind, COMMITTED)
        return f"enqueue {item_id} {zone} {kind} d={delay} p={priority}"

    def step_cancel(self) -> str:
        """Cancel a random committed item by id, leased or not."""
        live = [m for m in self.items.values() if m.state == COMMITTED]
        if not live:
            return "cancel none"
        m = live[self.rng.randrange(len(live))]
        applied_before = self.store.fault_counts["unknown_result_applied"]
        try:
            self.q.cancel(m.zone.app, m.zone.tenant, m.item_id)
        except ItemNotFound:
            if self.store.fault_counts["unknown_result_applied"] > applied_before:
                # Our first attempt deleted it, then commit_unknown_result made the retry
                # look for it again: it was cancelled, by us.
                m.state = CANCELLED
                m.lease = None
                return f"cancel {m.item_id} (applied, then not found)"
            return f"cancel {m.item_id} gone"
        except KVError as err:
            m.state = MAYBE  # may or may not have been cancelled
            return f"cancel {m.item_id} failed {err.code}"
        m.state = CANCELLED
        m.lease = None
        return f"cancel {m.item_id}"

    def step_enqueue_many(self) -> str:
        zone, kind = self._pick_zone(), self._pick_kind()
        n = self.rng.randint(1, 4)
        payloads = [self._payload() for _ in range(n)]
        ids = self.q.enqueue_many(
            kind,
            payloads,
            app=zone.app,
            tenant=zone.tenant,
            delay=self._pick_delay(),
            fifo=self._pick_fifo(),
        )
        for item_id in ids:
            self._add_item(item_id, zone, kind, COMMITTED)
        return f"enqueue_many {zone} {kind} {','.join(ids)}"

    def step_transact(self) -> str:
        """A user transaction writing its own key and enqueueing 1-3 items, sometimes
        aborted on purpose. Ids are drawn inside the function, so each retry enqueues new
        ids: which attempts committed is read off the simulator's fault counters (an
        attempt that ended in commit_unknown_result-applied committed; any other failed
        attempt did not)."""
        # Registered before it runs: an interleaved transaction inside this one's commit
        # must get its own number and key.
        txn = UserTxn(user_key(len(self.txns)), False)
        self.txns.append(txn)
        txn_no, key = len(self.txns) - 1, txn.key
        plan = [(self._pick_zone(), self._pick_kind()) for _ in range(self.rng.randint(1, 3))]
        abort = self.rng.random() < 0.2
        attempts: list[list[tuple[str, ZoneId, str]]] = []
        # Whether each finished attempt committed (commit_unknown_result, applied).
        applied: list[bool] = []

        def body(tr: KVTransaction) -> None:
            if attempts:
                applied.append(self.last_commit_applied)
            self.last_commit_applied = False
            made: list[tuple[str, ZoneId, str]] = []
            attempts.append(made)
            tr.set(key, b"%d" % len(attempts))
            for zone, kind in plan:
                item_id = self.q.enqueue(
                    kind,
                    self._payload(),
                    app=zone.app,
                    tenant=zone.tenant,
                    delay=self._pick_delay(),
                    tr=tr,
                    fifo=self._pick_fifo(),
                )
                made.append((item_id, zone, kind))
            if abort:
                raise _Abort()

        outcome = "committed"
        final_state = COMMITTED
        try:
            self.q.transact(body)
        except _Abort:
            outcome, final_state = "aborted", ABSENT
            self.aborted_txns += 1
        except KVError as err:
            outcome, final_state = f"failed {err.code}", MAYBE if err.maybe_committed else ABSENT
        any_committed = final_state == COMMITTED
        # The last attempt ended as the call did; earlier ones as their commit did.
        states = [COMMITTED if a else ABSENT for a in applied] + [final_state]
        for made, state in zip(attempts, states, strict=False):
            any_committed = any_committed or state == COMMITTED
            for item_id, zone, kind in made:
                self._add_item(item_id, zone, kind, state)
        txn.committed = any_committed
        made_ids = [m[0] for ms in attempts for m in ms]
        return f"transact {txn_no} {outcome} attempts={len(attempts)} {','.join(made_ids)}"

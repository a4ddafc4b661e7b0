"""The simulation world: one seeded run, its steps and when they are checked.

Everything random comes from seeded generators and the run is single-threaded, so one seed
is one run: failures replay exactly with ``python -m quickzones.testing.simulation --seed N``.

The checker keeps a model of what must be true (which enqueues committed, which leases were
handed to whom, how often handlers ran) and compares it with the store:

* cheap checks after every step, fed by handler calls and consumer events;
* a full scan of the committed state every ``check_every`` steps and at quiescence.

The parts, one module each: the model's records (``model``), the state they share
(``world``), the producer steps (``producers``), the handlers (``handlers``), the consumer
steps (``consumers``), the FIFO check at every dequeue (``fifo``) and the invariants
(``invariants``). This module wires them into :class:`Simulation` and runs it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from quickzones import schemes
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import Work
from quickzones.consumer.election import LocalElection
from quickzones.registry import RetryPolicy
from quickzones.store.ids import SeededIds
from quickzones.store.tuple_layer import fdbtuple
from quickzones.testing.simulation.consumers import ConsumerSteps
from quickzones.testing.simulation.fifo import FifoOrderCheck
from quickzones.testing.simulation.handlers import SimHandlers
from quickzones.testing.simulation.invariants import InvariantChecks
from quickzones.testing.simulation.model import (
    AMO,
    CLUSTER,
    COMMITTED,
    PLAIN,
    START_TIME,
    TTL,
    TTL_S,
    TX,
    ItemModel,
    SimConfig,
    SimConsumer,
    SimResult,
    UserTxn,
    Violation,
    effect_key,
)
from quickzones.testing.simulation.producers import ProducerSteps

_STEP_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("enqueue", 18.0),
    ("transact", 9.0),
    ("enqueue_many", 2.0),
    ("cancel", 1.0),
    ("scan", 12.0),
    ("visit", 20.0),
    ("execute", 22.0),
    ("flush", 2.0),
    ("extend", 1.0),
    ("election", 6.0),
    ("tick", 10.0),
    ("jump", 0.25),
    ("crash", 0.25),
    ("join", 0.5),
)
_STEP_KINDS = [k for k, _ in _STEP_WEIGHTS]
_CUM_WEIGHTS: list[float] = []
_total = 0.0
for _, _w in _STEP_WEIGHTS:
    _total += _w
    _CUM_WEIGHTS.append(_total)


class Simulation(ProducerSteps, SimHandlers, ConsumerSteps, FifoOrderCheck, InvariantChecks):
    """One seeded run: ``Simulation(SimConfig(seed=3)).run()``."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        seed = config.seed
        self.rng = random.Random(seed)
        self.clock = ManualClock(START_TIME)
        f = config.faults
        latency = 1.0 if f else 0.0
        url = (
            f"memory://?seed={seed}&fault_not_committed={f}&fault_unknown_result={f}"
            f"&fault_too_old={f}&latency_ms={latency}"
        )
        # The memory simulator through the scheme registry, like any store: the core
        # imports no backend. Added latency moves virtual time on at every commit with
        # writes (1 ms). The store's commit is the one point where a transaction's reads
        # are done and its writes not yet visible: running another step there (the commit
        # hook) makes the two concurrent.
        open_memory = schemes.factory(schemes.STORES, "memory", url)
        self.store: Any = open_memory(url, clock=self.clock, commit_hook=self._commit_hook)
        shards = config.shards if config.shards is not None else self.rng.choice((1, 2))
        self.depth = 1  # no step interleaves the client's opening (its layout's commit)
        self.q = Quick(
            self.store,
            clock=self.clock,
            cluster=CLUSTER,
            shards=shards,
            # Item, lease and pointer ids from the seed: pointer ids order the scanner's
            # peek, so without this a seed would not replay.
            ids=SeededIds(seed * 7919 + 17),
            zone_store=self._watched_zone_store,
        )
        self.keys = self.q.keys
        self.election = LocalElection(self.clock)
        retry = RetryPolicy(max_attempts=3, backoff_base_s=0.2, backoff_cap_s=2.0)
        self.q.job(PLAIN, retry=retry)(self._handle_plain)
        self.q.job(TX, retry=retry, transactional=True)(self._handle_tx)
        self.q.job(AMO, delivery="at_most_once", max_concurrency=3)(self._handle_amo)
        self.q.job(TTL, retry=retry, ttl_s=TTL_S)(self._handle_ttl)
        self.items: dict[str, ItemModel] = {}
        self.txns: list[UserTxn] = []
        self.aborted_txns = 0
        self.consumers: list[SimConsumer] = []
        self.consumer_serial = 0
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, str]] = set()
        self.step_no = 0
        self.trace = hashlib.blake2b(digest_size=16)
        self.executing: Work | None = None
        self.producing = True
        self.depth = 0  # nesting of interleaved steps (at most one level)
        self.busy: list[SimConsumer] = []  # consumers inside an operation
        self.last_commit_applied = False
        # Starvation bookkeeping (invariant 10): in-order rounds finished so far, and per
        # pointer when it was last leased / first seen vested (time, rounds).
        self.in_order_rounds = 0
        self.pointer_leased: dict[str, tuple[float, int]] = {}
        self.vested_seen: dict[tuple[str, int], tuple[float, int]] = {}
        zp = (self.keys.root, "z")
        self._z_prefix = fdbtuple.pack(zp)
        self._c_prefix = fdbtuple.pack((self.keys.root, "c", CLUSTER))
        self._enqueue_no = 0
        # Half the enqueues are FIFO (ordered by commit versionstamp). A stream of its own,
        # so the choice does not shift the main stream's draws.
        self.fifo_rng = random.Random(seed * 7919 + 1)

    # --- interleaving inside commits ----------------------------------------------------

    def _commit_hook(
        self, request: Any, commit: Callable[[Any], tuple[int, int]]
    ) -> tuple[int, int]:
        if self.depth == 0 and self.cfg.interleave and self.rng.random() < self.cfg.interleave:
            self.depth += 1
            try:
                self._nested_step()
            finally:
                self.depth -= 1
        counts = self.store.fault_counts
        before = counts["unknown_result_applied"]
        try:
            return commit(request)
        finally:
            # Read by the next attempt of a user transaction: did the last one commit?
            self.last_commit_applied = counts["unknown_result_applied"] > before

    def _nested_step(self) -> None:
        idle = [sc for sc in self.consumers if sc not in self.busy]
        choices = ["enqueue", "transact"] if self.producing else []
        if any(sc.refs for sc in idle):
            choices.append("visit")
        if any(sc.works for sc in idle):
            choices.append("execute")
        if not choices:
            return
        kind = self.rng.choice(choices)
        if kind == "enqueue":
            text = self.step_enqueue()
        elif kind == "transact":
            text = self.step_transact()
        else:
            ready = [sc for sc in idle if (sc.refs if kind == "visit" else sc.works)]
            sc = ready[self.rng.randrange(len(ready))]
            text = self._consumer_step(kind, sc)
        self._log(f"  nested {text}")

    # --- the run -------------------------------------------------------------------------

    def _pick_step(self) -> str:
        r = self.rng.random() * _total
        for kind, cum in zip(_STEP_KINDS, _CUM_WEIGHTS, strict=True):
            if r < cum:
                return kind
        return _STEP_KINDS[-1]

    def step(self) -> None:
        kind = self._pick_step()
        if not self.consumers:
            kind = "join"
        if kind == "join" and len(self.consumers) >= self.cfg.max_consumers:
            kind = "tick"
        sc = self._pick_consumer() if kind in _CONSUMER_STEPS else None
        if kind == "scan" and self.rng.random() < 0.5:
            # Half the scans go to the in-order scanner, if any: enough in-order rounds
            # for the starvation bound (invariant 10) to be checked within a run.
            sc = next((c for c in self.consumers if c.consumer.in_order), sc)
        text: str
        if kind == "enqueue":
            text = self.step_enqueue()
        elif kind == "transact":
            text = self.step_transact()
        elif kind == "enqueue_many":
            text = self.step_enqueue_many()
        elif kind == "cancel":
            text = self.step_cancel() if self.producing else "cancel skipped"
        elif kind == "tick":
            dt = round(self.rng.uniform(0.0, 0.5), 3)
            self.clock.advance(dt)
            text = f"tick {dt}"
        elif kind == "jump":
            dt = round(self.rng.uniform(10.5, 40.0), 3)  # past item and pointer leases
            self.clock.advance(dt)
            text = f"jump {dt}"
        elif kind == "crash":
            text = self.step_crash()
        elif kind == "join":
            text = f"join {self._new_consumer().consumer.name}"
        else:
            assert sc is not None
            text = self._consumer_step(kind, sc)
        self._log(f"{self.step_no} {text}")
        self.check_step()

    def _consumer_step(self, kind: str, sc: SimConsumer) -> str:
        self.busy.append(sc)
        try:
            return self._consumer_step_in(kind, sc)
        finally:
            self.busy.pop()

    def _consumer_step_in(self, kind: str, sc: SimConsumer) -> str:
        if kind == "scan":
            return self.step_scan(sc)
        if kind == "visit":
            return self.step_visit(sc)
        if kind == "execute":
            return self.step_execute(sc)
        if kind == "flush":
            return f"flush {sc.consumer.name} {sc.consumer.flush_completions()}"
        if kind == "extend":
            sc.consumer.extend_leases_once()
            return f"extend {sc.consumer.name}"
        return self.step_election(sc)

    def run(self) -> SimResult:
        for _ in range(2):
            self._new_consumer()
        for n in range(1, self.cfg.steps + 1):
            self.step_no = n
            self.step()
            if self.step_no % self.cfg.check_every == 0:
                self.check_store()
            if len(self.violations) > 50:
                break
        self.step_no = self.cfg.steps + 1
        self.producing = False
        self.quiesce()
        lost = self.check_store(final=True)
        snapshot = self.store.snapshot_items()
        digest = hashlib.blake2b(digest_size=16)
        for k, v in snapshot.items():
            digest.update(k)
            digest.update(v)
        self.trace.update(digest.digest())
        return self._result(lost)

    def _result(self, lost: int) -> SimResult:
        committed = [m for m in self.items.values() if m.state == COMMITTED]
        snapshot_keys = self.store.snapshot_items()
        dead = sum(1 for m in committed if m.dead_key in snapshot_keys)
        done = sum(
            1
            for m in committed
            if m.dead_key not in snapshot_keys
            and (m.successes if m.kind in (PLAIN, TTL) else m.deliveries if m.kind == AMO else 1)
            and m.item_key not in snapshot_keys
        )
        return SimResult(
            seed=self.cfg.seed,
            steps=self.cfg.steps,
            faults=self.cfg.faults,
            violations=self.violations,
            trace_hash=self.trace.hexdigest(),
            fault_counts=dict(self.store.fault_counts),
            enqueued=len(committed),
            completed=done,
            dead_lettered=dead,
            lost=lost,
            aborted_txns=self.aborted_txns,
        )

    def quiesce(self) -> None:
        """Stop producers and drain: time moves on in 1 s rounds in which every consumer
        refreshes its election, runs what it holds, scans and runs what it finds."""
        for sc in self.consumers:
            size = sc.consumer.config.visits_at_once()
            for start in range(0, len(sc.refs), size):
                sc.works.extend(self._visit(sc, sc.refs[start : start + size]))
            sc.refs.clear()
        for n in range(self.cfg.drain_rounds):
            for sc in self.consumers:
                sc.consumer.refresh_election()
            for sc in self.consumers:
                while sc.works:
                    self._execute(sc, sc.works.pop(0))
                if sc.leaser is not None:
                    for work in self.pull(sc):
                        self._execute(sc, work)
                refs = sc.consumer.scan_once()
                size = sc.consumer.config.visits_at_once()
                for start in range(0, len(refs), size):
                    for work in self._visit(sc, refs[start : start + size]):
                        self._execute(sc, work)
                sc.consumer.flush_completions()
            self.check_step()
            if n % 5 == 4 and not self._zones_hold_items():
                break
            self.clock.advance(1.0)
        self._log(f"quiesced at {self.clock.now():.3f}")

    def _zones_hold_items(self) -> bool:
        prefix = self._z_prefix
        for key in self.store.snapshot_items():
            if key.startswith(prefix) and b"\x02i\x00" in key[len(prefix) :]:
                return True
        return False


_CONSUMER_STEPS = frozenset({"scan", "visit", "execute", "flush", "extend", "election"})


def run_seed(seed: int, steps: int = 2000, faults: float = 0.01, **options: Any) -> SimResult:
    return Simulation(SimConfig(seed=seed, steps=steps, faults=faults, **options)).run()


__all__ = ["SimConfig", "SimResult", "Simulation", "Violation", "effect_key", "run_seed"]

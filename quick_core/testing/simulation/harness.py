"""The simulation world, its steps and its invariant checker.

Everything random comes from seeded generators and the run is single-threaded, so one seed
is one run: failures replay exactly with ``python -m quickzones.testing.simulation --seed N``.

The checker keeps a model of what must be true (which enqueues committed, which leases were
handed to whom, how often handlers ran) and compares it with the store:

* cheap checks after every step, fed by handler calls and consumer events;
* a full scan of the committed state every ``check_every`` steps and at quiescence.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import fdb.tuple as fdbtuple

from quickzones import schemes
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import Consumer, ConsumerConfig, Work
from quickzones.consumer.election import LocalElection
from quickzones.errors import CorruptRecord, ItemNotFound, Nack, PermanentError, TransientError
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.ids import SeededIds
from quickzones.store.kv import KVError, KVTransaction, pack_i64, unpack_i64
from quickzones.store.records import ZoneId, decode_pointer
from quickzones.store.toplevel import PointerRef
from quickzones.store.zones import KVZoneStore
from quickzones.store.zonestore import ZoneStore

# Job types the simulation registers, one per delivery mode.
PLAIN = "sim_plain"  # at-least-once, completion batched after the handler
TX = "sim_tx"  # transactional: effect and completion commit together
AMO = "sim_amo"  # at-most-once: deleted when its handler starts
TTL = "sim_ttl"  # at-least-once with a TTL: run before its deadline or dead-lettered
TTL_S = 2.0

# Item states in the model.
COMMITTED = "committed"  # the enqueue committed: must run or be dead-lettered
CANCELLED = "cancelled"  # cancelled by id after committing: may or may not have run
ABSENT = "absent"  # the enqueue never committed: must never appear or run
MAYBE = "maybe"  # the enqueue raised after maybe committing: either is fine

APPS = ("mail", "photos", "backup")
TENANTS = ("t0", "t1", "t2", "t3")
START_TIME = 1_700_000_000.0
CLUSTER = "sim"


def effect_key(item_id: str) -> bytes:
    """Where a transactional handler counts its runs: outside quick's root prefix."""
    return b"effect/" + item_id.encode()


def user_key(txn_no: int) -> bytes:
    return b"user/%08d" % txn_no


class _Abort(Exception):
    """Raised by a producer to abort its own transaction on purpose."""


class _CheckedDequeue:
    """A zone store whose every dequeue goes through ``check(real_dequeue, ...)``; every
    other operation is the wrapped store's own. Injected, so nothing in core is patched."""

    def __init__(self, inner: ZoneStore, check: Callable[..., tuple[list[Any], list[Any]]]) -> None:
        self._inner = inner
        self._check = check

    def dequeue(
        self, zone: ZoneId, max_items: int, lease_ms: int, **options: Any
    ) -> tuple[list[Any], list[Any]]:
        return self._check(self._inner.dequeue, zone, max_items, lease_ms, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(frozen=True, slots=True)
class Violation:
    step: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.kind}: {self.detail}"


@dataclass(slots=True)
class SimConfig:
    seed: int = 0
    steps: int = 2000
    faults: float = 0.01  # probability per commit of each fault kind
    check_every: int = 100  # full store scan period, in steps
    max_consumers: int = 4
    shards: int | None = None  # None: chosen by the seed (1 or 2)
    # A vested pointer may wait this long in virtual time and this many in-order scan
    # rounds. Rounds are generous because with several shards the in-order scanner fills
    # its selection from shards in shuffled order: a pointer behind a full shard is skipped
    # with probability 1/2 per round, so only a bound in rounds far beyond that is a bug.
    starvation_bound_s: float = 30.0
    starvation_rounds: int = 12
    drain_rounds: int = 600  # quiescence: rounds of 1 s virtual time at most
    zone_store: Callable[[Quick], KVZoneStore] | None = None  # mutants for checker tests
    # Chance that a commit first lets another actor run (and commit) a whole step: the
    # one thread then has transactions that really overlap, so conflicts are real.
    interleave: float = 0.2


@dataclass(slots=True)
class ItemModel:
    item_id: str
    zone: ZoneId
    kind: str
    state: str
    item_key: bytes
    dead_key: bytes
    successes: int = 0  # plain handler returned normally
    deliveries: int = 0  # handler invocations (at-most-once must stay <= 1)
    completed_event: bool = False
    early: bool = False  # seen by a consumer before its enqueue call returned
    lease: str | None = None  # the last lease handed to a consumer, None once released


@dataclass(slots=True)
class UserTxn:
    key: bytes
    committed: bool


@dataclass(slots=True)
class SimConsumer:
    consumer: Consumer
    refs: list[PointerRef] = field(default_factory=list)
    works: list[Work] = field(default_factory=list)
    round_in_order: bool = False  # its current refs came from an in-order scan
    leased_zones: list[ZoneId] = field(default_factory=list)  # pointer_leased events


@dataclass(slots=True)
class SimResult:
    seed: int
    steps: int
    faults: float
    violations: list[Violation]
    trace_hash: str
    fault_counts: dict[str, int]
    enqueued: int  # committed items (maybe-committed ones that showed up included)
    completed: int
    dead_lettered: int
    lost: int
    aborted_txns: int

    @property
    def ok(self) -> bool:
        return not self.violations


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


class Simulation:
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

    # --- FIFO order ---------------------------------------------------------------------

    def _watched_zone_store(self, q: Quick) -> ZoneStore:
        """The run's zone store (a mutant's, for checker tests), with every dequeue checked
        against commit order."""
        make = self.cfg.zone_store
        inner = make(q) if make is not None else q.zones
        return cast(ZoneStore, _CheckedDequeue(inner, self._check_fifo_dequeue))

    def _check_fifo_dequeue(
        self,
        real: Callable[..., tuple[list[Any], list[Any]]],
        zone: ZoneId,
        max_items: int,
        lease_ms: int,
        **options: Any,
    ) -> tuple[list[Any], list[Any]]:
        """Check a dequeue against commit order: it hands out its never-leased FIFO
        items of one priority in commit order, and leaves no older never-leased FIFO item
        of their zone and priority behind, unless the consumer refused that one (its job
        type at its concurrency cap)."""
        refused: set[str] = set()
        accept = options.get("accept")

        def noting(item: Any) -> bool:
            ok = accept is None or bool(accept(item))
            if not ok:
                refused.add(item.item_id)
            return ok

        # A dequeue inside a caller's transaction (one-transaction and batched visits)
        # is seen as that transaction sees the zone, its own uncommitted writes included.
        view = options.get("tr")
        before = self._fifo_items(zone, view)
        items, corrupt = real(zone, max_items, lease_ms, **{**options, "accept": noting})
        taken = [i.item_id for i in items if i.item_id in before]
        last: dict[int, tuple[bytes, int]] = {}
        for item_id in taken:  # a batch hands its FIFO items out in commit order
            priority, order = before[item_id]
            if priority in last and order < last[priority]:
                self._violate("fifo_order", f"{zone}: {item_id} handed out after a newer item")
            last[priority] = order
        if taken:
            after = self._fifo_items(zone, view)
            for item_id in taken:
                priority, order = before[item_id]
                for other, (other_priority, other_order) in after.items():
                    older = other_priority == priority and other_order < order
                    if older and other not in refused:
                        self._violate(
                            "fifo_order",
                            f"{zone}: {item_id} leased while older {other} waits",
                            about=other,
                        )
        return items, corrupt

    def _fifo_items(
        self, zone: ZoneId, view: KVTransaction | None = None
    ) -> dict[str, tuple[int, tuple[bytes, int]]]:
        """Never-leased FIFO items of ``zone`` now, or as ``view`` (a transaction) sees
        them: id -> (priority, commit order). Snapshot reads: no conflict added."""
        from quickzones.store.records import decode_item

        prefix = self.keys.zone_prefix(zone)
        tr = view if view is not None else self.store.create_transaction()
        out: dict[str, tuple[int, tuple[bytes, int]]] = {}
        for key, raw in tr.get_range(*self.keys.items_range(zone), snapshot=True):
            if len(fdbtuple.unpack(key[len(prefix) :])) != 2:
                continue  # a payload chunk
            try:
                item = decode_item(key, raw)
            except CorruptRecord:
                continue
            if item.commit_order is not None:
                out[item.item_id] = (item.priority, item.commit_order)
        return out

    # --- bookkeeping ---------------------------------------------------------------------

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

    # --- handlers ------------------------------------------------------------------------

    def _outcome(self) -> str:
        r = self.rng.random()
        if r < 0.10:
            return "transient"
        if r < 0.13:
            return "permanent"
        if r < 0.17:
            return "nack"
        return "ok"

    def _early(self, item_id: str, zone: ZoneId, job_type: str) -> ItemModel:
        """An item a consumer got before its producer's enqueue returned (the enqueue
        committed, then retried after commit_unknown_result with a step interleaved)."""
        self._add_item(item_id, zone, job_type, MAYBE)
        model = self.items[item_id]
        model.early = True
        return model

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

    # --- consumer events -----------------------------------------------------------------

    def _observer(self, sc: SimConsumer) -> Callable[[str, dict[str, Any]], None]:
        name = sc.consumer.name

        def observe(event: str, fields: dict[str, Any]) -> None:
            item_id = fields.get("item_id")
            self._log(f"  {name} {event} {item_id or ''}")
            if event == "pointer_leased":
                sc.leased_zones.append(fields["zone"])
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

    # --- producers -----------------------------------------------------------------------

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

    # --- consumers -----------------------------------------------------------------------

    def _new_consumer(self) -> SimConsumer:
        self.consumer_serial += 1
        name = f"c{self.consumer_serial}"
        # Every other consumer visits in batches of up to 3 zones per transaction (one
        # transaction per visit otherwise: the paper's three).
        batched = (self.cfg.seed + self.consumer_serial) % 2 == 1
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
            in_order=None,
            seed=self.cfg.seed * 1000 + self.consumer_serial,
            one_transaction_visits=batched,
            visits_per_transaction=3 if batched else 1,
        )
        consumer = self.q.consumer(config, election=self.election, name=name)
        sc = SimConsumer(consumer)
        consumer.observer = self._observer(sc)
        self.consumers.append(sc)
        return sc

    def _pick_consumer(self) -> SimConsumer | None:
        if not self.consumers:
            return None
        return self.consumers[self.rng.randrange(len(self.consumers))]

    def step_scan(self, sc: SimConsumer) -> str:
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
        size = sc.consumer.config.visits_per_transaction
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
            size = sc.consumer.config.visits_per_transaction
            for start in range(0, len(sc.refs), size):
                sc.works.extend(self._visit(sc, sc.refs[start : start + size]))
            sc.refs.clear()
        for n in range(self.cfg.drain_rounds):
            for sc in self.consumers:
                sc.consumer.refresh_election()
            for sc in self.consumers:
                while sc.works:
                    self._execute(sc, sc.works.pop(0))
                refs = sc.consumer.scan_once()
                size = sc.consumer.config.visits_per_transaction
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

    # --- invariants ----------------------------------------------------------------------

    def check_step(self) -> None:
        """Cheap checks after every step."""
        leaders = [sc.consumer.name for sc in self.consumers if sc.consumer.in_order]
        if len(leaders) > 1:
            self._violate("two_in_order_scanners", ",".join(leaders))

    def check_store(self, *, final: bool = False) -> int:
        """Full scan of the committed state; returns the number of lost items."""
        snap = self.store.snapshot_items()
        now = now_ms(self.clock)
        zp, cp = self._z_prefix, self._c_prefix
        zone_items: dict[ZoneId, dict[str, bytes]] = {}
        order: dict[ZoneId, set[tuple[int, tuple[object, ...], str]]] = {}
        counts: dict[ZoneId, int] = {}
        pointers: dict[tuple[int, str], tuple[ZoneId, int]] = {}
        vest_entries: list[tuple[int, int, str]] = []
        index: dict[ZoneId, tuple[int, str]] = {}
        for key, value in snap.items():
            if key.startswith(zp):
                parts = fdbtuple.unpack(key[len(zp) :])
                zone = ZoneId(parts[0], parts[1])
                tag = parts[2]
                if tag == "i" and len(parts) == 4:
                    zone_items.setdefault(zone, {})[parts[3]] = value
                elif tag == "x":
                    order.setdefault(zone, set()).add(_order_entry(parts[3:]))
                elif tag == "n":
                    counts[zone] = unpack_i64(value)
            elif key.startswith(cp):
                parts = fdbtuple.unpack(key[len(cp) :])
                shard, tag = parts[0], parts[1]
                if tag == "p":
                    p = decode_pointer(key, value)
                    pointers[(shard, p.pointer_id)] = (p.zone, p.vesting_ms)
                elif tag == "v":
                    vest_entries.append((shard, parts[2], parts[3]))
                elif tag == "ix":
                    index[ZoneId(parts[2], parts[3])] = (shard, value.decode())
        self._check_structure(zone_items, order, counts, pointers, vest_entries, index)
        self._check_starvation(vest_entries, now)
        lost = self._check_items(snap, zone_items, final=final)
        for txn in self.txns:
            if (txn.key in snap) != txn.committed:
                self._violate(
                    "user_txn_state",
                    f"{txn.key!r} exists={txn.key in snap} but committed={txn.committed}",
                )
        return lost

    def _check_structure(
        self,
        zone_items: dict[ZoneId, dict[str, bytes]],
        order: dict[ZoneId, set[tuple[int, tuple[object, ...], str]]],
        counts: dict[ZoneId, int],
        pointers: dict[tuple[int, str], tuple[ZoneId, int]],
        vest_entries: list[tuple[int, int, str]],
        index: dict[ZoneId, tuple[int, str]],
    ) -> None:
        from quickzones.store.records import decode_item

        for zone in sorted(set(zone_items) | set(order) | set(counts)):
            items = zone_items.get(zone, {})
            n = counts.get(zone, 0)
            if n != len(items):
                self._violate("zone_count", f"{zone}: count key {n}, {len(items)} items")
            expected: set[tuple[int, tuple[object, ...], str]] = set()
            for item_id, raw in items.items():
                rec = decode_item(b"", raw)
                if rec.commit_order is None:
                    expected.add((rec.priority, ("vesting", rec.vesting_ms), item_id))
                else:
                    expected.add((rec.priority, ("commit", *rec.commit_order), item_id))
            got = order.get(zone, set())
            if got != expected:
                missing, extra = sorted(expected - got)[:3], sorted(got - expected)[:3]
                self._violate("order_index", f"{zone}: missing {missing} extra {extra}")
            if items:
                # Invariant 1: a non-empty zone has a pointer in its top-level queue.
                entry = index.get(zone)
                if entry is None:
                    self._violate("zone_without_pointer", f"{zone}: {sorted(items)[:3]}")
                elif entry not in pointers:
                    self._violate("pointer_index_dangling", f"{zone} -> {entry}")
        for (shard, pid), (zone, _) in pointers.items():
            if index.get(zone) != (shard, pid):
                self._violate(
                    "pointer_not_indexed", f"{zone} pointer {pid} index {index.get(zone)}"
                )
        seen: dict[tuple[int, str], int] = {}
        for shard, vesting, pid in vest_entries:
            p = pointers.get((shard, pid))
            if p is None or p[1] != vesting:
                self._violate("vesting_entry_stale", f"pointer {pid} entry at {vesting}")
            seen[(shard, pid)] = seen.get((shard, pid), 0) + 1
        for key in pointers:
            if seen.get(key, 0) != 1:
                self._violate("pointer_vesting_entries", f"pointer {key[1]}: {seen.get(key, 0)}")

    def _check_starvation(self, vest_entries: list[tuple[int, int, str]], now: int) -> None:
        """Invariant 10: with an in-order scanner running, a vested pointer is leased within
        a bound of virtual time and of in-order scan rounds."""
        t, rounds = self.clock.now(), self.in_order_rounds
        current: dict[tuple[str, int], tuple[float, int]] = {}
        for _, vesting, pid in vest_entries:
            if vesting > now:
                continue
            key = (pid, vesting)
            first = self.vested_seen.get(key, (t, rounds))
            current[key] = first
            since_t, since_r = first
            leased = self.pointer_leased.get(pid)
            if leased is not None and leased[0] > since_t:
                since_t, since_r = leased
            if t - since_t > self.cfg.starvation_bound_s and rounds - since_r >= (
                self.cfg.starvation_rounds
            ):
                self._violate(
                    "vested_pointer_starved",
                    f"pointer {pid} vested at {vesting} unvisited for {t - since_t:.1f}s "
                    f"and {rounds - since_r} in-order rounds",
                    about=pid,
                )
        self.vested_seen = current

    def _check_items(
        self, snap: dict[bytes, bytes], zone_items: dict[ZoneId, dict[str, bytes]], *, final: bool
    ) -> int:
        lost = 0
        for m in self.items.values():
            present = m.item_id in zone_items.get(m.zone, {})
            dead = m.dead_key in snap
            effect = unpack_i64(snap.get(effect_key(m.item_id))) if m.kind == TX else 0
            if m.state == ABSENT:
                if present or dead or effect or m.deliveries:
                    self._violate("aborted_item_exists", f"{m.item_id} {m.zone}")
                continue
            if effect > 1:
                self._violate("tx_effect_twice", f"{m.item_id}: effect {effect}")
            if m.kind == TX and effect == 1 and (present or dead):
                self._violate(
                    "tx_effect_without_completion", f"{m.item_id} present={present} dead={dead}"
                )
            if m.completed_event and present and m.kind != AMO:
                self._violate("completed_item_present", m.item_id)
            if m.kind == AMO and present and m.deliveries:
                self._violate("at_most_once_delivered_but_present", m.item_id)
            if m.state != COMMITTED or present or dead:
                if final and present and m.state == COMMITTED:
                    self._violate("item_stuck", f"{m.item_id} in {m.zone} after draining")
                continue
            if (m.kind in (PLAIN, TTL) and m.successes == 0) or (m.kind == TX and effect != 1):
                lost += 1
                self._violate(
                    "item_lost",
                    f"{m.kind} {m.item_id} in {m.zone}: gone, not dead-lettered, never "
                    f"completed (runs {m.deliveries})",
                    about=m.item_id,
                )
        return lost


_CONSUMER_STEPS = frozenset({"scan", "visit", "execute", "flush", "extend", "election"})


def run_seed(seed: int, steps: int = 2000, faults: float = 0.01, **options: Any) -> SimResult:
    return Simulation(SimConfig(seed=seed, steps=steps, faults=faults, **options)).run()


def _order_entry(parts: tuple[object, ...]) -> tuple[int, tuple[object, ...], str]:
    """An order key's tail, (priority, vesting, id) or (priority, stamp, seq, id), in the
    shape the checker compares with what the item's record says."""
    priority, item_id = parts[0], parts[-1]
    assert isinstance(priority, int) and isinstance(item_id, str)
    if len(parts) == 3:
        return priority, ("vesting", parts[1]), item_id
    stamp = parts[1]
    assert isinstance(stamp, fdbtuple.Versionstamp)
    return priority, ("commit", stamp.tr_version, parts[2]), item_id

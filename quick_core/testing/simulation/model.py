"""What the simulation's checker models: the job types it registers, the states an item
can be in, and the records of items, user transactions, consumers, violations and a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from quickzones.client import Quick
from quickzones.consumer import Consumer, Work
from quickzones.consumer.pull_leaser import PullLeaser
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import PointerRef
from quickzones.store.zones import KVZoneStore

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
    # A pull consumer: its items are leased by a server's pull leaser (quick serve's
    # POST /v1/leases without HTTP) and run by its consumer's Worker, as a remote worker
    # runs them; its outcomes reach the store through the same Settler.
    leaser: PullLeaser | None = None


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

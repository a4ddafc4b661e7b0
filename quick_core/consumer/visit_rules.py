"""What a zone visit (paper Algorithm 2, :mod:`quickzones.consumer.visit`) is asked for and
follows: a zone's part of a visit (:class:`ZoneVisit`), its caller's admission
(:class:`Admission`), the rules of one visit call (:class:`VisitRules`), the size of a
zone's share, and what the pauses in force hold back (:class:`Hold`). Apart from the
visitor so that its callers (the Manager, the fetcher, the pull leaser) share these
without the visit's transactions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.tenant_admission import TenantHold
from quickzones.consumer.weighing import VisitWeight
from quickzones.errors import StorageError
from quickzones.store.kv import KVTransaction
from quickzones.store.pauses import REFRESH_S, PauseSet
from quickzones.store.records import Pointer, WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef
from quickzones.store.zonestore import CorruptItem


class NeedsThreeTransactions(Exception):
    """Raised by an admission hook inside a transaction: this zone's app has dispatch
    limits, whose slots and grants are taken outside any transaction, so the visit is
    written off and takes the three transactions."""


@dataclass(slots=True)
class ZoneVisit:
    """One zone's part of a visit: what its caller asks for, and what the visit left."""

    ref: PointerRef
    room: int  # the dequeue's window: at most this many items
    # What the rules' ``accept`` reserved (item id -> job type): kept across the tries of
    # a transaction and a fall back to three transactions, so an item seen again is
    # reserved once; the caller settles it. A map per zone, as ids are unique per zone.
    reserved: dict[str, str] = field(default_factory=dict)
    pointer: Pointer | None = None
    # Inside a one-transaction visit: (shard, the pointer as stored) of a lease the
    # requeue writes (TopLevelQueue.lease_pointer).
    stored: tuple[int, Pointer] | None = None
    items: list[WorkItem] = field(default_factory=list)
    corrupt: list[CorruptItem] = field(default_factory=list)
    app_slots: int = 0  # the app's pool-wide concurrency slots the admission took
    tenant_hold: TenantHold | None = None  # what it took of its tenant's limits
    outcome: str = ""  # the pointer's requeue: "requeued", "deleted" or "lost"
    vests_ms: int | None = None  # the vesting time a requeued pointer got
    # The transaction's budget (quickzones.store.zones.budget) stopped this zone's
    # dequeue: its other vested items are left for the next visit.
    cut_short: bool = False
    # A three-transaction visit whose dequeue failed (its pointer was requeued).
    error: StorageError | None = None

    @property
    def zone(self) -> ZoneId:
        assert self.pointer is not None, "the zone is known once its pointer is leased"
        return self.pointer.zone

    def clear(self) -> None:
        """Forget a try that did not commit."""
        self.pointer, self.items, self.corrupt, self.app_slots, self.outcome = None, [], [], 0, ""
        self.stored, self.vests_ms = None, None
        self.tenant_hold, self.cut_short, self.error = None, False, None


class ZoneVisitsFailed(StorageError):
    """Some zones' visits failed with a storage error (``failed``: each pointer with its
    error) while the call's other zones were visited (``visited`` zones in all)."""

    def __init__(self, failed: list[tuple[PointerRef, StorageError]], visited: int) -> None:
        first = failed[0][1]
        super().__init__(
            f"{len(failed)} of {visited} zone visits failed; the first: {first}",
            retryable=first.retryable,
        )
        self.failed = failed
        self.visited = visited
        self.works: list[Any] = []  # what the call's other zones gave (a Manager's Works)


@dataclass(frozen=True, slots=True)
class Admission:
    """What a caller's admission hook lets a leased zone give."""

    room: int
    not_before_ms: int | None = None  # the pointer vests no earlier (an app's next window)
    app_slots: int = 0
    tenant_hold: TenantHold | None = None  # per-tenant limits: settled after the dequeue


# (zone, room, tr: None in three transactions) -> Admission; may raise
# NeedsThreeTransactions when given a transaction.
Admit = Callable[[ZoneId, int, KVTransaction | None], Admission]


Key = tuple[str, int, str]  # a pointer: cluster, shard, pointer id


def visit_key(ref: PointerRef) -> Key:
    """A zone's visits by its pointer (set aside, held to three transactions)."""
    return ref.cluster, ref.shard, ref.pointer_id


def _no_hand_out(visit: ZoneVisit) -> None:
    pass


@dataclass(frozen=True, slots=True)
class VisitRules:
    """What one visit call needs beyond its zones."""

    pointer_lease_ms: int
    item_lease_ms: int
    min_inactive_ms: int
    # Items vesting within this many ms are taken too (stores with lookahead_dequeue).
    horizon_ms: int = 0
    accept_pointer: Callable[[PointerRef, ZoneId], bool] | None = None  # routing
    resolve: Callable[[WorkItem], WorkItem] | None = None  # the consumer's job options
    # Given a zone's reservations, as its dequeue starts (each try): the predicate the
    # dequeue admits items with (per-type caps, job type filters). None: every item.
    accept: Callable[[dict[str, str]], Callable[[WorkItem], bool]] | None = None
    admit: Admit | None = None  # app limits; None: each zone may give its room
    # The pauses in force over a zone (quickzones.store.pauses, looked up as the zone is
    # leased, cached): a paused zone gives nothing, items of a paused job type stay
    # vested. None: nothing paused.
    paused: Callable[[ZoneId], PauseSet | None] | None = None
    # Tenant weights (quickzones.consumer.weighing): a zone's room by its weight, at most
    # the free capacity. None: every zone weighs 1.
    weight: VisitWeight | None = None
    # A leased zone's items once its dequeue committed, once per zone: before the
    # pointer's requeue in three transactions (a handler need not wait for one more
    # commit), after the commit in one.
    dequeued: Callable[[ZoneVisit], None] = _no_hand_out
    # How many items the visit may lease to start at once (the consumer's free workers),
    # read as it starts: what a zone gives beyond them is leased held (WorkItem.held, no
    # run counted until it starts). None: every item starts at once.
    start_now: Callable[[], int] | None = None
    # Told, in a one-transaction visit, how many items the transaction leased, once its
    # reads are done and before it commits: the room claimed for the visit beyond them
    # is free to other visits at once. A visit may claim more than the free workers
    # (dequeue_max), so keeping it all to the commit held every other zone's visit
    # behind a slow one. None: nobody is told.
    taking: Callable[[int], None] | None = None

    @classmethod
    def of(cls, config: ConsumerConfig, **options: Any) -> VisitRules:
        """The rules of ``config``'s leases (``item_lease_ms`` may be given instead)."""
        options.setdefault("item_lease_ms", int(config.item_lease_s * 1000))
        return cls(
            pointer_lease_ms=int(config.pointer_lease_s * 1000),
            min_inactive_ms=int(config.min_inactive_s * 1000),
            **options,
        )


def visit_size(config: ConsumerConfig, share: int) -> int:
    """How many items a visit may take from one zone, before the room the caller has and
    the limits: ``dequeue_max`` (invariant 7), or (work-conserving, beyond the paper) the
    water-filling ``share`` of the free capacity over the zones competing, when that is
    more, at most ``visit_max`` where set."""
    if config.visit_max is not None:
        share = min(config.visit_max, share)
    return max(config.dequeue_max, share)


@dataclass(slots=True)
class Hold:
    """What the pauses in force hold back of one zone's visit."""

    zone_paused: bool = False
    types: frozenset[str] = frozenset()
    recheck_ms: int = 0  # a held-back zone's pointer vests again then
    held_back: bool = False  # the dequeue left an item of a paused type

    @classmethod
    def of(
        cls, lookup: Callable[[ZoneId], PauseSet | None] | None, zone: ZoneId, clock: Clock
    ) -> Hold:
        paused = None if lookup is None else lookup(zone)
        if paused is None or not paused.pauses:
            return NOTHING_PAUSED  # never changed: held_back is set only by types held
        recheck = now_ms(clock) + int(REFRESH_S * 1000)
        return cls(paused.zone_paused(zone), paused.paused_types(zone), recheck)

    def accept(self, inner: Callable[[WorkItem], bool] | None) -> Callable[[WorkItem], bool] | None:
        """``inner`` with the paused job types left out (before it: no place reserved)."""
        if not self.types:
            return inner

        def accept(item: WorkItem) -> bool:
            if self.holds_type(item.job_type):
                self.held_back = True
                return False
            return inner is None or inner(item)

        return accept

    def holds_type(self, job_type: str) -> bool:
        """Whether an item of ``job_type`` stays vested at this visit's dequeue (a paused
        job type); ``quick explain`` asks the same."""
        return job_type in self.types


NOTHING_PAUSED = Hold()  # a zone under no pause: the common visit's, one object for all

"""Why an item has not started (issue 45 point 3): ``quick explain APP TENANT ITEM``.

For one item, every rule between it and a worker, in the order a consumer applies them
(Algorithm 1's scan, Algorithm 2's visit, the dequeue's predicates), each with its state
now. Each rule asks the predicate the consumer decides with, not a copy of it:

========================  ==============================================================
rule                      the consumer's code it asks
========================  ==============================================================
``item``                  the item's record: leased (running, or waiting for a worker),
                          finished, or absent (:func:`quickzones.store.outcomes`)
``consumer_alive``        the consumers' heartbeats (:mod:`quickzones.store.heartbeats`,
                          what ``quick serve``'s workers page shows)
``serves_app``            :func:`quickzones.consumer.routing.serves_app` over them
``vesting``               the zone store's peek: vested when ``vesting_ms <= now``
``zone_lease``            the zone's pointer record: leased by a consumer's visit, the
                          consumer's name recorded with the lease
``paused``                :class:`quickzones.consumer.visit_rules.Hold` (``zone_paused``)
``app_cap``, ``app_rate`` :meth:`Limits.slots_held` / :meth:`Limits.dispatches_used` with
                          :func:`quickzones.store.limits.free_of`, as ``Fetcher``'s
                          ``apply_app_limits`` grants
``tenant_cap``            the tenant's (then its job type's) slots, as ``TenantAdmission``
                          takes them (``free_of``)
``tenant_rate``           :meth:`Limits.next_start_ms`: the schedule ``grant_starts`` keeps
``weight``                the zone's weight (:class:`~quickzones.store.weights.Weights`);
                          never holds: turns are counted per consumer, in its memory
``type_paused``           :meth:`Hold.holds_type`
``serves_type``           :func:`quickzones.consumer.routing.serves_type`
``limit``, ``limit_rate`` the named limits the job type takes (its handler registered in
                          the explaining process), as ``LimitGate`` takes them
``type_cap``              the job type's ``pool_max_concurrency`` slots (its handler
                          registered here), as a Worker takes them after the limits
``one_at_a_time``        :func:`quickzones.store.flow_keys.waits_for`: the key's holder,
                          as its release passes the key on
(extensions)              :data:`RULES`: debounce keys go here
``zone_due``              the zone's pointer vests later than now (requeued after a
                          visit, at a limit's next slot): the rules above say why
========================  ==============================================================

It reads this item, its zone's pointer (by the pointer index), the settings of its app
and tenant (the consumer's cached lookups), the slot records of its app and tenant (one
per consumer holding some) and the consumers' heartbeats: nothing that grows with the
number of tenants. A tenant at its cap has its running items named from its own zone, at
most :data:`RUNNING_SCAN` items read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from quickzones.clock import now_ms
from quickzones.consumer.fetcher import APP_SCOPE, TYPE_SCOPE
from quickzones.consumer.routing import serves_app, serves_type
from quickzones.consumer.tenant_admission import SCOPE as TENANT_SCOPE
from quickzones.consumer.visit_rules import Hold
from quickzones.store import admin, flow_keys, heartbeats
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.kv import run
from quickzones.store.limits import free_of
from quickzones.store.named_limits import SCOPE as NAMED_SCOPE
from quickzones.store.records import Pointer, WorkItem, ZoneId
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.client import Quick

# A tenant at its cap: at most this many of its zone's items are read to name the running.
RUNNING_SCAN = 1000
_PAGE = 200
RUNNABLE = "nothing holds it: next scan"


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule's state now for the item: whether it holds the item back, why, until when
    (store ms; None: until something changes), and the items or consumers involved."""

    name: str
    holds: bool
    detail: str
    until_ms: int | None = None
    items: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why one item has or has not started: its state and each rule in the consumer's
    order."""

    app: str
    tenant: str
    item_id: str
    state: str  # queued, vested, leased, running, completed, cancelled, dead_lettered,
    # failed or absent
    job_type: str | None
    vesting_ms: int | None
    at_ms: int  # when it was explained (store ms)
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    @property
    def first(self) -> Rule | None:
        """The first rule that holds the item back: the one to act on."""
        return next((r for r in self.rules if r.holds), None)

    @property
    def summary(self) -> str:
        first = self.first
        return RUNNABLE if first is None else f"{first.name}: {first.detail}"

    def as_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "app": self.app,
            "tenant": self.tenant,
            "item_id": self.item_id,
            "state": self.state,
            "job_type": self.job_type,
            "vesting_ms": self.vesting_ms,
            "at_ms": self.at_ms,
            "first": None if first is None else first.name,
            "summary": self.summary,
            "rules": [{**asdict(r), "items": list(r.items), "consumers": list(r.consumers)}
                      for r in self.rules],
        }  # fmt: skip


@dataclass(slots=True)
class Context:
    """What the rules read, each once: the item, its zone, the time, the consumers."""

    q: Quick
    zone: ZoneId
    item: WorkItem
    now: int
    consumers: list[Heartbeat]
    hold: Hold | None = None

    @property
    def alive(self) -> list[Heartbeat]:
        return [h for h in self.consumers if not h.stale(self.now)]

    @property
    def serving(self) -> list[Heartbeat]:
        return [h for h in self.alive if serves_app(h.apps, self.zone)]

    def pauses(self) -> Hold:
        if self.hold is None:
            # Read fresh, as a consumer's lookup is within a second of a change.
            self.hold = Hold.of(self.q.pauses.of_zone, self.zone, self.q.clock)
        return self.hold


RuleFn = Callable[[Context], list[Rule]]


def _consumer_alive(c: Context) -> list[Rule]:
    alive = c.alive
    if not alive:
        stale = len(c.consumers)
        why = f" ({stale} stopped beating)" if stale else ""
        return [Rule("consumer_alive", True, f"no consumer alive{why}")]
    return [Rule("consumer_alive", False, f"{len(alive)} consumer(s) alive",
                 consumers=tuple(h.consumer_id for h in alive))]  # fmt: skip


def _serves_app(c: Context) -> list[Rule]:
    serving = c.serving
    if not serving:
        return [Rule("serves_app", True, f"no live consumer serves app {c.zone.app!r}")]
    ids = tuple(h.consumer_id for h in serving)
    return [Rule("serves_app", False, f"served by {', '.join(ids)}", consumers=ids)]


def _vesting(c: Context) -> list[Rule]:
    at = c.item.vesting_ms
    if at > c.now:
        return [Rule("vesting", True, f"not vested until {at} (in {at - c.now} ms)", at)]
    return [Rule("vesting", False, f"vested since {at}")]


def _zone_lease(c: Context) -> list[Rule]:
    pointer = c.q.toplevel.get_pointer(c.zone)
    if pointer is None:
        return [Rule("zone_lease", True, "the zone has no pointer: no scan finds it "
                     "(quick serve's repair, or the next enqueue, makes one)")]  # fmt: skip
    if pointer.lease_id is not None and pointer.vesting_ms > c.now:
        return [_zone_leased_by(pointer)]
    return [Rule("zone_lease", False, "zone not leased")]


def _zone_leased_by(pointer: Pointer) -> Rule:
    """A leased zone's rule, naming the consumer whose visit holds it (recorded with the
    lease; a pointer leased before records kept it gives the lease's id instead)."""
    until = pointer.vesting_ms
    if pointer.holder is None:
        who = f"a consumer's visit (lease {(pointer.lease_id or '')[:8]})"
        return Rule("zone_lease", True, f"zone leased by {who} until {until}", until)
    return Rule("zone_lease", True, f"zone leased by consumer {pointer.holder} until {until}",
                until, consumers=(pointer.holder,))  # fmt: skip


def _paused(c: Context) -> list[Rule]:
    hold = c.pauses()
    if hold.zone_paused:
        found = c.q.pauses.of_zone(c.zone).pauses
        names = [p.describe() for p in found if p.whole_zones and p.covers(c.zone)]
        return [Rule("paused", True, f"paused: {'; '.join(names)} (until resumed)")]
    return [Rule("paused", False, "app and tenant not paused")]


def _holders(held: dict[str, int]) -> tuple[str, ...]:
    return tuple(sorted(h for h, n in held.items() if n > 0))


def _app_limits(c: Context) -> list[Rule]:
    limits = c.q.limits.get(c.zone.app)
    out: list[Rule] = []
    if limits.max_concurrency is not None:
        held = c.q.limits.slots_held(APP_SCOPE, c.zone.app)
        used = sum(held.values())
        full = free_of(limits.max_concurrency, used, 1) == 0
        out.append(Rule("app_cap", full, f"app cap {used} of {limits.max_concurrency} "
                        "running", consumers=_holders(held)))  # fmt: skip
    if limits.dispatches_per_second is not None:
        used, window = c.q.limits.dispatches_used(c.zone.app)
        full = free_of(limits.dispatches_per_second, used, 1) == 0
        out.append(Rule("app_rate", full, f"app dispatch rate {used} of "
                        f"{limits.dispatches_per_second} this second; next window {window}",
                        window if full else None))  # fmt: skip
    return out or [Rule("app_cap", False, "no dispatch limit on the app")]


def _running(c: Context, wanted: int, job_type: str | None) -> tuple[str, ...]:
    """Up to ``wanted`` of the zone's leased items (of ``job_type``): its tenant's
    running ones, read from its own zone, at most RUNNING_SCAN items."""
    found: list[str] = []
    cursor: str | None = None
    for _ in range(RUNNING_SCAN // _PAGE):
        _, page = admin.zone_item_page(c.q, c.zone, limit=_PAGE, cursor=cursor)
        for i in page.rows:
            leased = i.lease_id is not None and i.vesting_ms > c.now
            if leased and i.item_id != c.item.item_id and job_type in (None, i.job_type):
                found.append(i.item_id)
        if len(found) >= wanted or page.next_cursor is None:
            break
        cursor = page.next_cursor
    return tuple(found[:wanted])


def _tenant_limits(c: Context) -> list[Rule]:
    limits = [lim for lim in c.q.tenant_limit_store.of_zone(c.zone)
              if lim.job_type in (None, c.item.job_type)]  # fmt: skip
    # The tenant-wide limit first, as TenantAdmission.admit applies them.
    limits.sort(key=lambda lim: lim.job_type is not None)
    out: list[Rule] = []
    for lim in limits:
        whose = "tenant" if lim.job_type is None else f"tenant's {lim.job_type!r}"
        if lim.max_running is not None:
            held = c.q.limits.slots_held(TENANT_SCOPE, lim.name())
            used = sum(held.values())
            full = free_of(lim.max_running, used, 1) == 0
            items = _running(c, used, lim.job_type) if full else ()
            running = f" ({', '.join(items)})" if items else ""
            out.append(Rule("tenant_cap", full, f"{whose} cap {used} of {lim.max_running} "
                            f"running{running}", items=items,
                            consumers=_holders(held)))  # fmt: skip
        if lim.rate is not None:
            nxt = c.q.limits.next_start_ms(lim.name(), lim.rate, lim.per_ms)
            rate = f"{whose} rate {lim.rate}/{lim.per_s:g}s"
            if nxt is None:
                out.append(Rule("tenant_rate", False, f"{rate}: a start is allowed now"))
            else:
                out.append(Rule("tenant_rate", True, f"{rate}: next slot at {nxt}", nxt))
    return out or [Rule("tenant_cap", False, "no limit on the tenant or this job type")]


def _named_limits(c: Context) -> list[Rule]:
    """The named limits the item's job type takes (its handler registered here: what a
    type names is declared in code), as :class:`~quickzones.consumer.limit_gate.LimitGate`
    takes them: the tenant's share, the total, the rate, ``cost`` slots of each."""
    job = c.q.registry.find(c.item.job_type)
    if job is None:
        return [Rule("limit", False, f"job type {c.item.job_type!r} has no handler in "
                     "this process: its named limits (declared with it) are not known "
                     "here")]  # fmt: skip
    defined = c.q.named_limits.of_app(c.zone.app)
    out: list[Rule] = []
    for name in job.limits:
        lim = defined.get(name)
        if lim is None:
            out.append(Rule("limit", True, f"limit {name}: not defined for app {c.zone.app!r}; "
                            f"its items wait (quick limits set {name} --app {c.zone.app} "
                            "...)"))  # fmt: skip
            continue
        for slot, cap, whose in (
            (lim.tenant_name(c.zone.tenant), lim.per_tenant, f"tenant {c.zone.tenant}'s share"),
            (lim.total_name(), lim.concurrency, "total"),
        ):
            if cap is None:
                continue
            held = c.q.limits.slots_held(NAMED_SCOPE, slot)
            used = sum(held.values())
            full = free_of(cap, used, job.cost) < job.cost
            cost = "" if job.cost == 1 else f"; a run takes {job.cost}"
            out.append(Rule("limit", full, f"limit {name}: {used} of {cap} running ({whose}"
                            f"{cost})", consumers=_holders(held)))  # fmt: skip
        if lim.rate is not None:
            nxt = c.q.limits.next_start_ms(lim.total_name(), lim.rate, lim.per_ms)
            rate = f"limit {name}: rate {lim.rate}/{lim.per_s:g}s"
            if nxt is None:
                out.append(Rule("limit_rate", False, f"{rate}: a start is allowed now"))
            else:
                out.append(Rule("limit_rate", True, f"{rate}: next slot at {nxt}", nxt))
    return out or [Rule("limit", False, f"job type {c.item.job_type!r} names no limit")]


def _type_cap(c: Context) -> list[Rule]:
    """The job type's pool-wide cap (``pool_max_concurrency``, declared with its handler,
    registered here), as a Worker takes its slot once the named limits let it start
    (``Slots.acquire`` of scope ``type``), with the consumers holding its slots."""
    job = c.q.registry.find(c.item.job_type)
    if job is None or job.pool_max_concurrency is None:
        known = "no pool-wide cap" if job is not None else "no handler in this process"
        return [Rule("type_cap", False, f"job type {c.item.job_type!r}: {known}")]
    cap = job.pool_max_concurrency
    held = c.q.limits.slots_held(TYPE_SCOPE, job.name)
    used = sum(held.values())
    full = free_of(cap, used, 1) == 0
    return [Rule("type_cap", full, f"job type {job.name!r} pool-wide cap {used} of {cap} "
                 "running", consumers=_holders(held))]  # fmt: skip


def _weight(c: Context) -> list[Rule]:
    w = c.q.tenant_weights.of_zone(c.zone)
    if w is None:
        return [Rule("weight", False, "no weight stored for the app: unweighted visits")]
    return [
        Rule(
            "weight",
            False,
            f"weight {w:g}: where tenants contend its zone takes "
            f"{w:g}x a weight-1 zone's turn (each consumer counts the turns)",
        )
    ]


def _type_paused(c: Context) -> list[Rule]:
    if c.pauses().holds_type(c.item.job_type):
        found = c.q.pauses.of_zone(c.zone).pauses
        names = [p.describe() for p in found if p.job_type == c.item.job_type
                 and p.covers(c.zone)]  # fmt: skip
        return [Rule("type_paused", True, f"job type paused: {'; '.join(names)} (until resumed)")]
    return [Rule("type_paused", False, f"job type {c.item.job_type!r} not paused")]


def _serves_type(c: Context) -> list[Rule]:
    serving = c.serving
    if not serving:
        return []  # serves_app holds already
    ids = tuple(h.consumer_id for h in serving if serves_type(h.job_types, c.item.job_type))
    if not ids:
        return [Rule("serves_type", True, f"no live consumer of app {c.zone.app!r} "
                     f"serves job type {c.item.job_type!r}")]  # fmt: skip
    return [Rule("serves_type", False, f"job type served by {', '.join(ids)}", consumers=ids)]


def _one_at_a_time(c: Context) -> list[Rule]:
    """An item parked behind its one-at-a-time key's holder: what the key's release
    decides by (:func:`quickzones.store.flow_keys.waits_for`)."""
    key = c.item.meta.get(flow_keys.FLOW_META)
    if not key or key[0] != flow_keys.ONE_AT_A_TIME:
        return []
    holder = run(c.q.kv, lambda tr: flow_keys.waits_for(tr, c.q.keys, c.zone, c.item))
    if holder is None:
        return [Rule("one_at_a_time", False, f"holds its one-at-a-time key {key[1]!r}")]
    if holder == flow_keys.UNKNOWN_HOLDER:
        return [Rule("one_at_a_time", True, f"one-at-a-time key {key[1]!r}: its record is "
                     "corrupt, so an unknown holder has it: runs when the holder finishes "
                     "(which repairs the record) or its hold lapses")]  # fmt: skip
    return [Rule("one_at_a_time", True, f"one-at-a-time key {key[1]!r} held by item "
                 f"{holder}: runs when it completes, is cancelled or dead-lettered",
                 items=(holder,))]  # fmt: skip


def _zone_due(c: Context) -> list[Rule]:
    pointer = c.q.toplevel.get_pointer(c.zone)
    if pointer is not None and pointer.lease_id is None and pointer.vesting_ms > c.now:
        return [Rule("zone_due", True, f"the zone's pointer vests at {pointer.vesting_ms}: "
                     "a scan finds it then", pointer.vesting_ms)]  # fmt: skip
    return [Rule("zone_due", False, "the zone's pointer is due")]


# The rules in the order a consumer applies them. Debounce, one-at-a-time and idempotency
# keys (issue 45, branch flow45) insert theirs before ``_zone_due``: a function of the
# Context returning its Rule(s), asking the predicate the consumer decides with.
RULES: list[RuleFn] = [
    _consumer_alive,
    _serves_app,
    _vesting,
    _zone_lease,
    _paused,
    _app_limits,
    _tenant_limits,
    _weight,
    _type_paused,
    _serves_type,
    _named_limits,
    _type_cap,
    _one_at_a_time,
    _zone_due,
]


def _item_rule(item: WorkItem | None, state: str, at_ms: int | None) -> Rule:
    if item is None:
        when = "" if at_ms is None else f" at {at_ms}"
        what = "not in its zone" if state == "absent" else f"{state.replace('_', '-')}{when}"
        return Rule("item", True, f"{what}: nothing to start")
    lease = "running on a consumer" if state == "running" else "leased, waiting for a worker"
    return Rule("item", True, f"{lease} until {item.vesting_ms} (lease end)", item.vesting_ms)


def explain(
    q: Quick, app: str, tenant: str, item_id: str, *, rules: list[RuleFn] | None = None
) -> Explanation:
    """Why item ``item_id`` of (``app``, ``tenant``) has not started: its state, and each
    rule of :data:`RULES` (or ``rules``) with its state now. Snapshot reads only: it
    conflicts with no consumer or producer."""
    zone = q.zone(app, tenant)
    item_id = check_name("item_id", item_id)
    now = now_ms(q.clock)
    item = q.items.get(zone, item_id)
    if item is None or (item.lease_id is not None and item.vesting_ms > now):
        if item is None:
            status = q.status(app, tenant, item_id) if q.capabilities.outcome_records else None
            state = "absent" if status is None else status.state
            at = None if status is None else status.at_ms
        else:
            state = "leased" if item.held else "running"
            at = item.vesting_ms
        return Explanation(app, tenant, item_id, state,
                           None if item is None else item.job_type,
                           None if item is None else item.vesting_ms, now,
                           (_item_rule(item, state, at),))  # fmt: skip
    state = "vested" if item.vesting_ms <= now else "queued"
    c = Context(q, zone, item, now, heartbeats.heartbeats(q.kv, q.keys))
    found = [r for fn in (RULES if rules is None else rules) for r in fn(c)]
    return Explanation(
        app,
        tenant,
        item_id,
        state,
        item.job_type,
        item.vesting_ms,
        now,
        (Rule("item", False, f"{state}, {item.attempts} run(s) so far"), *found),
    )

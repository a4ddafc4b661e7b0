"""The public API: open a store by URL, register handlers, enqueue, run consumers.

q = Quick.open("sqlite:///quick.db")

@q.job("send_email", max_concurrency=4)
def send_email(payload, ctx): ...

q.enqueue("send_email", {"to": "a@example.com"}, app="mail", tenant="user-1")

def signup(tr):                       # user data and the enqueue commit together
    tr.set(b"users/1", b"...")
    q.enqueue("send_email", {...}, app="mail", tenant="user-1", tr=tr)
q.transact(signup)

q.consumer().run_forever()
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Callable, Iterable, Sequence, Sized
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from quickzones import batches
from quickzones.batches import Batch, Chain, Job
from quickzones.clock import Clock, now_ms
from quickzones.consumer import Cluster, Consumer, ConsumerConfig, Observer
from quickzones.consumer.election import Election
from quickzones.consumer.maintenance import HEARTBEAT_S
from quickzones.errors import (
    ConfigurationError,
    InvalidArgument,
    TransactionTooLarge,
    UnknownJobType,
    UnsupportedByStore,
)
from quickzones.periodic import Schedule, Scheduler, schedule_decorator
from quickzones.registry import Handler, JobType, Registry, RetryPolicy
from quickzones.store import flow_key_lapses, outcomes
from quickzones.store.batches import BatchStatus, Member
from quickzones.store.flow_keys import Debounce, FlowKey, flow_key
from quickzones.store.ids import IdSource
from quickzones.store.keys import KeySpace
from quickzones.store.kv import (
    TRANSACTION_SIZE_LIMIT,
    KVError,
    KVStore,
    KVTransaction,
    may_retry_in_place,
    run,
)
from quickzones.store.limits import AppLimits, Limits
from quickzones.store.named_limits import Limit, NamedLimits
from quickzones.store.pages import Page
from quickzones.store.pauses import Pause, Pauses
from quickzones.store.records import DeadLetter, WorkItem, ZoneId
from quickzones.store.run_at import delay_seconds
from quickzones.store.sql import (
    SQLTopLevelQueue,
    SQLTransaction,
    SQLZoneStore,
    check_zone_layout,
    native_sql,
    statements,
)
from quickzones.store.steady_clock import clock_for
from quickzones.store.tenant_limits import TenantLimit, TenantLimits
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.type_policies import TypePolicies, TypePolicy
from quickzones.store.validation import (
    DEFAULT_MAX_PAYLOAD,
    check_job_type,
    check_name,
    check_priority,
    check_seconds,
    encode_payload,
)
from quickzones.store.weights import TenantWeight, Weights
from quickzones.store.zones import KVZoneStore, new_item_id
from quickzones.store.zonestore import NewItem, ZoneStore, ZoneStoreCapabilities
from quickzones.tracing import TRACE_KEY, enqueue_span
from quickzones.urls import open_kv

if TYPE_CHECKING:
    from quickzones.store.admin import Requeued

T = TypeVar("T")

# Builds the zone store a Quick hands its items to, from the Quick's KV store, top-level
# queue, keys and clock (``quick.kv``, ``quick.toplevel``, ...).
ZoneStoreFactory = Callable[["Quick"], ZoneStore]

# Tries of an enqueue_on inside the application's transaction after a conflict it can
# retry there (PostgreSQL at READ COMMITTED), before the conflict is the application's.
IN_PLACE_RETRIES = 20
# How long run_until_idle waits at most for part two of the applications' enqueues this
# process saw committed (PostgreSQL's after-commit thread: two of its rounds, ms each).
SETTLE_AFTER_COMMITS_S = 1.0


class Wakeable(Protocol):
    """Something that scans again at once when told work was enqueued."""

    def wake(self) -> None: ...


class Quick:
    """A QuiCK deployment: a KV store holding the top-level queue, and a zone store
    holding the items (by default KV zones in the same store; ``zone_store`` injects
    another, e.g. Cassandra zones). What the zone store cannot do is refused once, with
    :class:`~quickzones.errors.UnsupportedByStore`, where a call needs it.

    ``ids`` (default: ``secrets``) makes item, lease and pointer ids; a replayable run
    passes a seeded source.

    ``clock`` defaults to the system clock, read through a floor kept in the store so that
    time never runs backwards across processes (``steady_clock``, on by default for the
    system clock). A clock you pass otherwise, such as a test's ``ManualClock``, is used as
    given unless ``steady_clock=True``.

    ``shards``: how many shards the top-level queue of ``cluster`` has. The first open of
    a store stores it (default 1); later opens use the stored layout, and one asking for
    another is refused with :class:`~quickzones.store.layout.LayoutMismatch` (change it
    with ``quick reshard``). ``create=False`` (tools that only read, as in :meth:`open`)
    writes nothing.

    ``cluster``: which top-level queue of the store. An open of a cluster the store does
    not have, while it has others, is refused with
    :class:`~quickzones.store.layout.UnknownCluster` naming them (a producer and a
    consumer of different clusters would never see each other's work);
    ``new_cluster=True`` starts it beside them.
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        clock: Clock | None = None,
        cluster: str = "default",
        shards: int | None = None,
        root: str = "quick",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        strict_job_types: bool = False,
        fifo: bool = False,
        steady_clock: bool | None = None,
        zone_store: ZoneStoreFactory | None = None,
        ids: IdSource | None = None,
        keep_status_s: float = 0.0,
        create: bool = True,
        new_cluster: bool = False,
    ) -> None:
        self.kv = kv
        self.keys = KeySpace(root)
        # Steady: time never runs backwards across the processes sharing this store, so a
        # wall clock set back does not stall leases and delays (docs/guarantees.md#clock-steps).
        self.clock = clock_for(kv, self.keys.meta_key("clock"), clock, steady_clock)
        sql = native_sql(kv)
        sql_top = None
        if sql is not None:  # items and pointers in SQL tables (zones=sql)
            sql_top = SQLTopLevelQueue(
                kv, sql, statements(root, sql.sql_dialect, sql.sql_namespace), keys=self.keys,
                cluster=cluster, clock=self.clock, ids=ids,
            )  # fmt: skip
        self.toplevel = sql_top or TopLevelQueue(
            kv, keys=self.keys, cluster=cluster, clock=self.clock, ids=ids
        )
        self.toplevel.open_layout(shards, store=create, new_cluster=new_cluster)
        self.ids = self.toplevel.ids
        # The KV zones: items, unless a zone store is injected; dead letters and admin.
        self.zones = KVZoneStore(kv, self.toplevel, keys=self.keys, clock=self.clock)
        if sql is not None and sql_top is not None and zone_store is None:
            native = SQLZoneStore(
                sql, sql_top.q, sql_top, kv, self.zones, clock=self.clock, ids=self.ids
            )
            if create:
                native.create_tables()
            zone_store = lambda q: native  # noqa: E731 - made above, before the layout's use
        check_zone_layout(kv, root, self.toplevel)
        self.items: ZoneStore = self.zones if zone_store is None else zone_store(self)
        if isinstance(self.items, KVZoneStore):
            self.zones = self.items  # an injected KV zone store (a variant) serves both
        self.registry = Registry()
        # This process's consumers of this client (and quick serve's long polls): an
        # enqueue wakes their scanners.
        self._consumers: weakref.WeakSet[Wakeable] = weakref.WeakSet()
        self.max_payload = max_payload
        # With strict job types an enqueue of an unregistered type fails at once; producers
        # that do not import the handlers leave it off.
        self.strict_job_types = strict_job_types
        # FIFO: this client's items without a delay are ordered within their priority by
        # commit versionstamp, not by the producer's clock (docs/guarantees.md#ordering).
        self.fifo = fifo
        if fifo:
            self._require("fifo", "FIFO ordering (fifo=True)")
        self.limits = Limits(kv, self.keys, self.clock)
        self.pauses = Pauses(kv, self.keys, self.clock)
        self.tenant_weights = Weights(kv, self.keys, self.clock)
        self.tenant_limit_store = TenantLimits(kv, self.keys, self.clock)
        self.named_limits = NamedLimits(kv, self.keys, self.clock)
        # Outcome records (status after completion, results, dedupe window) per job type;
        # ``keep_status_s`` is the default for types that set none (0: no record, so a
        # completion costs nothing extra; docs/status.md says why).
        self.keep_status_s = check_seconds("keep_status_s", keep_status_s)
        self._policies: dict[str, outcomes.Policy] = {}
        # Each registered type's policy is stored, so producers that never import the
        # handler (a web process, quick serve) enqueue under it too (issue 28, point 7).
        self.type_policies = TypePolicies(kv, self.keys)
        self._create = create
        self._schedules: list[Schedule] = []

    @property
    def capabilities(self) -> ZoneStoreCapabilities:
        """What this deployment's zone store supports."""
        return self.items.capabilities

    def _require(self, capability: str, what: str, hint: str = "") -> None:
        if not getattr(self.items.capabilities, capability):
            raise UnsupportedByStore(what, capability, type(self.items).__name__, hint)

    @classmethod
    def open(
        cls, url: str, *, clock: Clock | None = None, create: bool = True, **options: Any
    ) -> Quick:
        """Open the store a URL names: ``memory://``, ``sqlite:///path``, ``fdb://``.

        ``create=False`` (tools that only read) opens only an existing quick store and
        writes nothing while opening: a missing file raises ``StoreNotFound``, a file that
        is not a quick store ``NotAQuickStore`` and is left untouched.
        """
        return cls(open_kv(url, clock=clock, create=create), clock=clock, create=create, **options)

    def close(self) -> None:
        self.kv.close()

    def __enter__(self) -> Quick:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- handlers ----------------------------------------------------------------------

    def job(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        max_concurrency: int | None = None,
        pool_max_concurrency: int | None = None,
        execution_bound_s: float | None = None,
        transactional: bool = False,
        delivery: str = "at_least_once",
        ttl_s: float | None = None,
        keep_status_s: float | None = None,
        keep_result_s: float | None = None,
        dedupe_s: float | None = None,
        limits: Sequence[str] = (),
        cost: int = 1,
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(payload, ctx)`` for a job type.

        ``limits``: the names of the app's limits (:meth:`set_limit`) each run takes
        ``cost`` slots of while its handler runs, shared with every job type naming them
        (docs/limits.md).

        A transactional handler gets ``ctx.tr``; its writes and the item's completion
        commit in one transaction (exactly once). ``delivery="at_most_once"`` deletes the
        item when its handler starts, so it never runs twice (and may not run at all).

        ``keep_status_s``: :meth:`status` answers for a finished item this long;
        ``keep_result_s``: the handler's return value (bytes or JSON, at most 64 KiB) is
        kept this long for :meth:`result`; ``dedupe_s``: an enqueue reusing the id of an
        item that finished within this window is a no-op that says so (a caller-chosen
        ``item_id``). Each writes one small record when an item finishes.

        The type's policy is also stored, so producers that never register the handler
        (a web process, ``quick serve``) honour it: when a consumer of this client starts,
        and with its first enqueue that commits in quick's own transaction. A registration
        writes nothing itself, so it may come inside an application's open transaction.
        """
        policy = self._policy_of(keep_status_s, keep_result_s, dedupe_s)
        if (policy.wanted() or self.keep_status_s) and not self.capabilities.outcome_records:
            raise UnsupportedByStore(
                f"job type {name!r}: status, results or a dedupe window",
                "outcome_records",
                type(self.items).__name__,
                "only live items' status is available",
            )

        if transactional:
            self._require(
                "transactional_handlers",
                f"job type {name!r}: transactional handlers",
                "an item's delete cannot commit with the handler's KV transaction",
            )

        def register(fn: Handler) -> Handler:
            job = JobType(
                name=name,
                handler=fn,
                retry=retry or RetryPolicy(),
                max_concurrency=max_concurrency,
                pool_max_concurrency=pool_max_concurrency,
                execution_bound_s=execution_bound_s,
                transactional=transactional,
                delivery=delivery,
                ttl_s=ttl_s,
                limits=limits,  # type: ignore[arg-type]  # checked and made a tuple
                cost=cost,
            )
            self.registry.register(job)
            self._policies[name] = policy
            # A read-only client (create=False) writes nothing.
            if self._create:
                self.type_policies.declare(name, _type_policy(policy, job))
            return fn

        return register

    def store_type_policies(self) -> None:
        """Store the policies of the types registered here and not stored yet, so
        producers that never register their handlers honour them. A consumer's start and
        an enqueue committing in quick's own transaction call it; ``quick worker --remote``
        at its start. A store that refuses keeps them pending (said once at WARNING)."""
        self.type_policies.store_pending()

    def _policy_of(
        self, status_s: float | None, result_s: float | None, dedupe_s: float | None
    ) -> outcomes.Policy:
        def ms(kind: str, value: float | None) -> int:
            return 0 if value is None else int(check_seconds(kind, value) * 1000)

        return outcomes.Policy(
            ms("keep_status_s", status_s if status_s is not None else self.keep_status_s),
            ms("keep_result_s", result_s),
            ms("dedupe_s", dedupe_s),
        )

    # --- periodic jobs -----------------------------------------------------------------

    def periodic(
        self,
        cron: str,
        *,
        job: str,
        app: str,
        tenant: str,
        payload: Any = b"",
        name: str | None = None,
        tz: str = "UTC",
        catch_up: str = "latest",
        priority: int = 0,
    ) -> Callable[[Handler], Handler]:
        """Enqueue ``job`` into (app, tenant) at every slot of the cron expression
        ``cron``, evaluated in time zone ``tz``; as a decorator it also registers the
        function as the job's handler. Every ``quick worker`` (or :meth:`scheduler`) runs
        the schedule; however many do, each slot is enqueued once (:mod:`quickzones.periodic`).

        ``name`` (default: job, zone and cron) identifies the schedule in the store: keep
        it when changing the expression. ``catch_up``: after downtime enqueue only the
        latest missed slot ("latest") or every one ("all").
        """
        check_job_type(job)
        encode_payload(payload, self.max_payload)  # refuse a bad payload now, not per slot
        schedule = Schedule(
            name=name if name is not None else f"{job}@{app}/{tenant}@{cron}",
            cron=cron,
            job_type=job,
            app=check_name("app", app),
            tenant=check_name("tenant", tenant),
            payload=payload,
            tz=tz,
            catch_up=catch_up,
            priority=check_priority(priority),
        ).check()
        if any(s.name == schedule.name for s in self._schedules):
            raise ConfigurationError(f"a periodic schedule named {schedule.name!r} exists")
        self._schedules.append(schedule)
        return schedule_decorator(self, schedule)

    @property
    def schedules(self) -> list[Schedule]:
        """The periodic schedules registered on this client."""
        return list(self._schedules)

    def scheduler(self, **options: Any) -> Scheduler:
        """A scheduler of this client's schedules: ``tick()`` it, or ``start()`` its
        thread (``quick worker`` does); options: ``interval_s``, ``lookahead_s``."""
        return Scheduler(self, **options)

    # --- enqueue -----------------------------------------------------------------------

    def _new_item(
        self,
        job_type: str,
        payload: Any,
        delay: float | timedelta | None,
        priority: int,
        item_id: str | None,
        ttl: float | None,
        fifo: bool | None = None,
        run_at: datetime | None = None,
        flow: FlowKey | None = None,
    ) -> NewItem:
        check_job_type(job_type)
        job = self.registry.find(job_type)
        if job is None and self.strict_job_types:
            raise UnknownJobType(job_type)
        declared = self._declared(job_type, job)
        # The clock is read where the item's time is taken (the zone store's write); here
        # only a run_at needs it, to turn it into a delay.
        delay_s = delay_seconds(delay, run_at, 0.0 if run_at is None else self.clock.now())
        check_priority(priority)
        chosen = item_id is not None
        if item_id is not None:
            check_name("item_id", item_id)
        else:
            # Chosen before the transaction runs, so a retry after commit_unknown_result
            # finds the item it already wrote instead of writing a second one.
            item_id = new_item_id(self.ids)
        if ttl is not None:
            ttl_ms: int | None = int(check_seconds("ttl", ttl) * 1000)
        else:
            ttl_ms = None if declared is None else declared.ttl_ms
        body, content_type = encode_payload(payload, self.max_payload)
        policy = None if declared is None else declared.outcome
        if policy is None and self.keep_status_s and self.capabilities.outcome_records:
            policy = self._policy_of(None, None, None)
        meta: dict[str, Any] = {}
        if policy is not None and policy.wanted():
            meta = outcomes.policy_meta(policy, body, content_type)
        if flow is not None:
            meta.update(flow.meta())
        return NewItem(
            job_type=job_type,
            payload=body,
            delay_ms=delay_s * 1000,
            priority=priority,
            item_id=item_id,
            content_type=content_type,
            ttl_ms=ttl_ms,
            delivery=declared.delivery if declared is not None else "at_least_once",
            fifo=self._fifo(fifo),
            meta=meta,
            # Only a caller-chosen id can match a finished item's record: a random one
            # skips the read.
            check_outcome=chosen and self.capabilities.outcome_records,
            fresh_id=not chosen,
            flow=flow,
        )

    def _declared(self, job_type: str, job: JobType | None) -> TypePolicy | None:
        """The type's policy: this client's registration (``job``, the registry's entry
        of ``job_type``), else the one stored by the process that registered the handler
        (None: no handler of it ever registered)."""
        if job is None:
            return self.type_policies.get(job_type)
        policy = self._policies.get(job_type)  # None: put in the registry directly
        return _type_policy(policy or self._policy_of(None, None, None), job)

    def _fifo(self, fifo: bool | None) -> bool:
        if fifo is None:
            return self.fifo
        if _check_flag("fifo", fifo):
            self._require("fifo", "FIFO ordering (fifo=True)")
        return fifo

    def enqueue(
        self,
        job_type: str,
        payload: Any = b"",
        *,
        app: str,
        tenant: str,
        delay: float | timedelta = 0.0,
        priority: int = 0,
        item_id: str | None = None,
        ttl: float | None = None,
        tr: KVTransaction | None = None,
        fifo: bool | None = None,
        run_at: datetime | None = None,
        after: str | tuple[str, str] | None = None,
        idempotency_key: str | None = None,
        idempotency_ttl_s: float | None = None,
        debounce: Debounce | None = None,
        one_at_a_time: str | None = None,
    ) -> str:
        """Enqueue one item into the zone (app, tenant); returns its id.

        Without ``tr`` it commits on its own. With ``tr`` it joins the caller's transaction
        (reading the pointer index, never a pointer record, so no consumer's pointer lease
        can abort it); whoever commits that transaction, the pointer's vesting time is
        pulled earlier after the commit (:mod:`quickzones.store.enqueue`). A caller-chosen
        ``item_id`` makes the enqueue idempotent: the id returned (an
        :class:`~quickzones.store.enqueue.Enqueued`, a ``str``) has ``duplicate`` set to
        "queued" when the id is in the zone, or to the state of an item of this id that
        finished within its type's ``dedupe_s``; a different payload under a known id
        raises :class:`~quickzones.store.outcomes.DuplicateItemMismatch`. ``fifo`` (default: the
        client's) orders an item without a delay by its commit among the priority's other
        FIFO items. ``delay`` is seconds or a ``timedelta``; ``run_at`` instead, a
        timezone-aware ``datetime``, is when it should run (one already past: now).
        ``after``: a job's id (in ``tenant``, or a (tenant, id) pair) this one waits for: it
        is enqueued in the transaction that completes that job, and never if that job is
        dead-lettered or cancelled (docs/batches.md).

        ``idempotency_key``: while an item enqueued with this key in the zone is queued or
        running, another enqueue of the key stores nothing and returns that item's id
        (``duplicate`` "queued"); the key is released in the transaction that completes,
        cancels or dead-letters it, or ``idempotency_ttl_s`` seconds after that (a
        duplicate then says how it finished). ``debounce``: a :class:`Debounce`; the
        key's queued item takes this payload and vests once the key was quiet ``wait_s``
        or ``max_wait_s`` after its first enqueue (``duplicate`` "debounced", the id is
        that item's); one that is running is left alone and a new item started.
        ``one_at_a_time``: a key whose items run one at a time, in enqueue order, across
        every consumer (an item enqueued while another of the key is queued or running
        waits for it to complete, be cancelled or dead-lettered; a retried one keeps the
        key through its backoff). Keys are per (app, tenant) (docs/flow-control.md).
        """
        zone = ZoneId(check_name("app", app), check_name("tenant", tenant))
        flow = flow_key(
            idempotency_key,
            idempotency_ttl_s,
            debounce,
            item_id=item_id,
            delayed=bool(delay) or run_at is not None,
            after=after,
            one_at_a_time=one_at_a_time,
        )
        if flow is not None:
            self._require("flow_keys", "idempotency, debounce and one-at-a-time keys")
        # The application's own transaction, as the native SQL zones join it (enqueue_on).
        native_tr = getattr(tr, "native", False) is True
        if tr is not None and not native_tr:
            self._require(
                "caller_transactions",
                "enqueue inside a KV transaction (tr=...)",
                "call enqueue() without tr",
            )
        if tr is None:
            self.store_type_policies()  # never in a caller's transaction
        new = self._new_item(job_type, payload, delay, priority, item_id, ttl, fifo, run_at, flow)
        if after is not None:
            if tr is not None:
                raise InvalidArgument("after", after, "cannot be given with tr")
            return batches.enqueue_after(self, after, zone.app, Member(zone, new))
        with enqueue_span(job_type, zone) as carrier:
            if carrier:
                new = replace(new, meta={**new.meta, TRACE_KEY: carrier})
            # The app's enqueue-rate charge runs in the transaction that checks the pointer;
            # none where the app has no enqueue rate (its limits cached for a second): a
            # zone store whose items are not in that transaction would otherwise make one
            # for nothing (zones=sql).
            charge = None
            if self.limits.get(zone.app, None if native_tr else tr).enqueues_per_minute:
                charge = lambda t: self.limits.charge_enqueue(t, zone.app)  # noqa: E731
            enqueued = self.items.enqueue(zone, new, tr=tr, in_pointer_txn=charge)
        if tr is None:
            self._wake_consumers()
        elif native_tr:
            cast(SQLTransaction, tr).after_commit(self._wake_consumers)  # the app's COMMIT
        else:
            tr.on_commit(self._wake_consumers)  # after the pointer's part two
        return enqueued

    def wake_on_enqueue(self, waiter: Wakeable) -> None:
        """Call ``waiter.wake()`` after each enqueue this client commits (held weakly):
        how a consumer or a long poll in this process hears of new work at once."""
        self._consumers.add(waiter)

    def _wake_consumers(self) -> None:
        """Local consumers scan now, not at their next idle poll (exact timers)."""
        if not self._consumers:
            return  # a producer alone: copying an empty WeakSet costs more than a check
        for consumer in list(self._consumers):
            consumer.wake()

    def wake_waiters(self) -> None:
        """Local consumers and long polls scan now: an item became due through a write of
        this client's that was no enqueue (a dead letter requeued, an item nacked). A
        store's commit watcher ignores the store's own commits, so they would otherwise
        find it at their next idle poll."""
        self._wake_consumers()

    def enqueue_on(
        self,
        connection: object,
        job_type: str,
        payload: Any = b"",
        *,
        app: str,
        tenant: str,
        delay: float = 0.0,
        priority: int = 0,
        item_id: str | None = None,
        ttl: float | None = None,
        fifo: bool | None = None,
        idempotency_key: str | None = None,
        idempotency_ttl_s: float | None = None,
        debounce: Debounce | None = None,
        one_at_a_time: str | None = None,
    ) -> str:
        """Enqueue inside the application's own transaction, through its own
        ``connection`` to the store's database: on ``sqlite:///...`` a
        ``sqlite3.Connection``, on ``postgresql://...`` a psycopg ``Connection`` (at any
        isolation level); on both a SQLAlchemy ``Connection``/``Session`` or Django's
        ``connection``. The application's COMMIT commits its rows and the item together;
        its ROLLBACK leaves neither. Options as :meth:`enqueue`.

        On SQLite, from this call until the application commits or rolls back, its
        transaction holds the file's write lock (consumers' commits wait for it): commit
        soon. On PostgreSQL it holds only locks no other tenant, and with ``zones=sql``
        no other enqueuer of its zone nor any consumer, waits for. Errors and conflict
        rules: docs/tutorial-sqlite-transaction.md, docs/backends.md (PostgreSQL).
        """

        def enqueue_in(tr: KVTransaction) -> str:
            """This enqueue, joined to the application's transaction ``tr``."""
            return self.enqueue(
                job_type,
                payload,
                app=app,
                tenant=tenant,
                delay=delay,
                priority=priority,
                item_id=item_id,
                ttl=ttl,
                tr=tr,
                fifo=fifo,
                idempotency_key=idempotency_key,
                idempotency_ttl_s=idempotency_ttl_s,
                debounce=debounce,
                one_at_a_time=one_at_a_time,
            )

        # zones=sql: the native statements in the application's transaction; else a KV
        # transaction joined to it.
        native = native_sql(self.kv) is not None
        join = getattr(self.kv, "sql_on" if native else "transaction_on", None)
        if join is None:
            raise UnsupportedByStore(
                "enqueue in the application's own transaction",
                "sql_on" if native else "transaction_on",
                type(self.kv).__name__,
                "open the store with sqlite:///path (the file holding the application's"
                " tables) or postgresql://... (the database holding them)",
            )
        if native:
            with join(connection) as native_tr:
                return enqueue_in(cast(KVTransaction, native_tr))
        for attempt in range(1, IN_PLACE_RETRIES + 1):
            tr: KVTransaction | None = None
            try:
                with join(connection) as tr:
                    return enqueue_in(tr)
            except KVError as err:
                # A conflict with a concurrent commit (two first enqueues into one zone
                # both making its pointer): where the application's transaction reads
                # newer commits (PostgreSQL at READ COMMITTED), quick's part of it was
                # undone and runs again inside it; else the application must.
                if tr is None or attempt == IN_PLACE_RETRIES or not may_retry_in_place(tr, err):
                    raise
                time.sleep(0.001 * attempt * random.random())
        raise AssertionError("unreachable")

    def set_limits(self, app: str, limits: AppLimits) -> None:
        """Per-app enqueue and dispatch rates and a pool-wide concurrency cap, enforced
        across every producer and consumer of this store."""
        self.limits.set(check_name("app", app), limits)

    def pause(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> Pause:
        """Hold back an app, a tenant of an app (``app`` and ``tenant``), or a job type (of
        ``app``, or of every app): nothing of it starts on any consumer or remote worker
        within about a second; running items finish, enqueues are accepted, and a held
        back item counts no attempt. Pausing twice is one pause (docs/pause.md)."""
        return self.pauses.pause(app, tenant, job_type)

    def resume(
        self, app: str | None = None, tenant: str | None = None, job_type: str | None = None
    ) -> bool:
        """Lift the pause named exactly so; False when there was none."""
        return self.pauses.resume(app, tenant, job_type)

    def paused(self) -> list[Pause]:
        """Every pause in force (read a page at a time: :meth:`pause_page` reads one)."""
        return self.pauses.list()

    def pause_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[Pause]:
        """One page of the pauses that hold back some of ``app`` (the job types paused in
        every app first, then the app's own, by tenant and job type; None: every pause),
        at most ``limit`` from ``cursor`` (a page's ``next_cursor``). It reads what it
        shows, however many lie behind; :class:`InvalidArgument` for a cursor that is not
        one of this list's."""
        return self.pauses.page(app, limit=limit, cursor=cursor)

    def set_weight(self, app: str, tenant: str | None, weight: float) -> TenantWeight:
        """Give ``tenant`` of ``app`` (None: every tenant of the app without a weight of
        its own) ``weight``: where tenants contend, one of weight w starts w times as
        many items as one of weight 1; idle capacity still goes to whoever has work.
        Every consumer sees it within about a second (docs/fairness.md)."""
        return self.tenant_weights.set(app, tenant, weight)

    def clear_weight(self, app: str, tenant: str | None) -> bool:
        """Drop the weight named exactly so; False when there was none."""
        return self.tenant_weights.clear(app, tenant)

    def weights(self) -> list[TenantWeight]:
        """Every stored weight (a tenant's, or with tenant None an app's default), read a
        page at a time (:meth:`weight_page` reads one)."""
        return self.tenant_weights.list()

    def weight_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[TenantWeight]:
        """One page of ``app``'s stored weights (its default first, then by tenant; None:
        every app's), at most ``limit`` from ``cursor`` (a page's ``next_cursor``), as
        :meth:`pause_page` pages."""
        return self.tenant_weights.page(app, limit=limit, cursor=cursor)

    def set_tenant_limit(
        self,
        app: str,
        tenant: str,
        job_type: str | None = None,
        *,
        max_running: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
    ) -> TenantLimit:
        """Limit ``tenant`` of ``app`` (or its items of ``job_type``) on every consumer:
        at most ``max_running`` running at once, at most ``rate`` starts per ``per``
        seconds (evenly spaced). Replaces its earlier limit; what is held back waits,
        counting no attempt, and other tenants run (docs/fairness.md)."""
        limit = TenantLimit.of(app, tenant, job_type, max_running=max_running, rate=rate, per=per)
        return self.tenant_limit_store.set(limit)

    def clear_tenant_limit(self, app: str, tenant: str, job_type: str | None = None) -> bool:
        """Lift the limit named exactly so; False when there was none."""
        return self.tenant_limit_store.clear(app, tenant, job_type)

    def tenant_limits(self) -> list[TenantLimit]:
        """Every per-tenant limit in force, read a page at a time
        (:meth:`tenant_limit_page` reads one)."""
        return self.tenant_limit_store.list()

    def tenant_limit_page(
        self, app: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> Page[TenantLimit]:
        """One page of ``app``'s per-tenant limits (by tenant, then job type; None: every
        app's), at most ``limit`` from ``cursor`` (a page's ``next_cursor``), as
        :meth:`pause_page` pages."""
        return self.tenant_limit_store.page(app, limit=limit, cursor=cursor)

    def enqueue_local(
        self, job_type: str, payload: Any = b"", *, shard: int = 0, delay: float | timedelta = 0.0
    ) -> str:
        """Enqueue a local work item: work about the cluster itself (maintenance, sweeps)
        kept in the top-level queue's own key range, run by the same consumers."""
        self._require("local_items", "local work items")
        zone = self.toplevel.local_zone(shard)
        item_id = self.zones.enqueue(zone, self._new_item(job_type, payload, delay, 0, None, None))
        self._wake_consumers()
        return item_id

    def enqueue_many(
        self,
        job_type: str,
        payloads: Iterable[Any],
        *,
        app: str,
        tenant: str,
        delay: float | timedelta = 0.0,
        priority: int = 0,
        fifo: bool | None = None,
        run_at: datetime | None = None,
    ) -> list[str]:
        """Enqueue several items into one zone in one transaction (with ``fifo``, in the
        order given): all of them commit or none. ``delay`` and ``run_at`` as
        :meth:`enqueue`'s, for every item.

        One transaction holds at most ``TRANSACTION_SIZE_LIMIT`` (10,000,000) bytes of
        writes and must commit within the 5 s lifetime; a batch certain to exceed the size
        fails at once with :class:`TransactionTooLarge`, before anything is written. Split
        large batches into several calls (each one atomic).
        """
        zone = ZoneId(check_name("app", app), check_name("tenant", tenant))
        self.store_type_policies()
        items: list[NewItem] = []
        # A lower bound of the commit's size, checked as the items are built so a batch
        # that could only fail at commit (after seconds of work) fails at once instead:
        # each item writes its payload, its record key and order-index key, and the write
        # conflict range of each key (the key and its successor).
        at_least = 0
        for payload in payloads:
            item = self._new_item(job_type, payload, delay, priority, None, None, fifo, run_at)
            items.append(item)
            item_id = item.item_id or ""  # always set by _new_item
            keys = len(self.keys.item_key(zone, item_id)) + len(
                self.keys.order_key(zone, item.priority, 0, item_id)
            )
            at_least += len(item.payload) + 3 * keys
            if at_least > TRANSACTION_SIZE_LIMIT:
                raise TransactionTooLarge(
                    at_least,
                    TRANSACTION_SIZE_LIMIT,
                    what=f"enqueue_many of {_count(payloads, len(items))} items",
                    at_least=True,
                )
        ids = self.items.enqueue_many(
            zone, items, in_pointer_txn=lambda tr, n: self.limits.charge_enqueue(tr, zone.app, n)
        )
        self._wake_consumers()
        return ids

    def enqueue_batch(
        self,
        jobs: Sequence[Job],
        *,
        app: str,
        callback: Job,
        fail_fast: bool = False,
        batch_id: str | None = None,
    ) -> Batch:
        """Enqueue ``jobs`` (any tenants of ``app``) in one transaction, and ``callback``
        once every one of them has finished: in the transaction that completes or
        dead-letters the last, so it is enqueued exactly once. The callback's payload (JSON)
        arrives inside a report: ``{"batch_id", "total", "completed", "dead_lettered",
        "cancelled", "failed": [{"tenant", "item_id", "state", "reason"}], "payload"}``.
        ``fail_fast``: call back at the first job that is dead-lettered or cancelled
        instead. Returns the batch's id, its items' ids and the callback's id
        (docs/batches.md)."""
        return batches.enqueue_batch(
            self, jobs, app=app, callback=callback, fail_fast=fail_fast, batch_id=batch_id
        )

    def chain(self, *steps: Job, app: str) -> Chain:
        """Enqueue ``steps[0]``; each later step is enqueued in the transaction that
        completes the one before it. A step dead-lettered or cancelled stops the chain."""
        return batches.chain(self, steps, app=app)

    def batch_status(self, app: str, batch_id: str) -> BatchStatus | None:
        """A batch's counts (total, completed, dead-lettered, cancelled, pending), its
        callback's id and whether it was enqueued; None when there is no such batch."""
        return batches.batch_status(self, app, batch_id)

    def transact(self, fn: Callable[[KVTransaction], T]) -> T:
        """Run ``fn(tr)`` in one transaction with retries; enqueues made inside it commit
        with the caller's own writes, or not at all."""
        return run(self.kv, fn)

    # --- zone operations ---------------------------------------------------------------

    def zone(self, app: str, tenant: str) -> ZoneId:
        return ZoneId(check_name("app", app), check_name("tenant", tenant))

    def get(self, app: str, tenant: str, item_id: str) -> WorkItem | None:
        return self.items.get(self.zone(app, tenant), item_id)

    def status(self, app: str, tenant: str, item_id: str) -> outcomes.JobStatus | None:
        """What became of an item: queued or leased (attempts, next vesting), or
        completed, cancelled or dead-lettered and when; None when unknown (never
        enqueued, or finished without a record kept, or its record expired).

        A finished item is known from its outcome record (job types with
        ``keep_status_s``, ``keep_result_s`` or ``dedupe_s``) or its dead letter."""
        zone = self.zone(app, tenant)
        item_id = check_name("item_id", item_id)
        item = self.items.get(zone, item_id)
        if item is not None:
            return outcomes.live_status(item)
        if not self.capabilities.outcome_records:
            raise UnsupportedByStore(
                "status of a finished item",
                "outcome_records",
                type(self.items).__name__,
                "the item is not queued; this store keeps no record of finished items",
            )
        return outcomes.finished_status(self.kv, self.keys, self.zones, zone, item_id, self._now())

    def result(self, app: str, tenant: str, item_id: str, *, timeout: float = 0.0) -> Any:
        """The return value of a completed item's handler (job types with
        ``keep_result_s``): bytes, or the JSON value. Raises
        :class:`~quickzones.store.outcomes.ResultNotAvailable` saying why there is none.

        ``timeout``: wait up to this many seconds for a queued or running item to finish,
        reading again after 50 ms, then twice as long each time, up to 1 s."""
        self._require("outcome_records", "results of finished items")
        zone = self.zone(app, tenant)
        item_id = check_name("item_id", item_id)
        wait = outcomes.ResultWait(check_seconds("timeout", timeout))
        while True:
            try:
                return outcomes.read_result(
                    self.kv, self.keys, self.items, zone, item_id, self._now()
                )
            except outcomes.ResultNotAvailable as missing:
                time.sleep(wait.sleep_after(missing))

    def collect_outcomes(self, limit: int = outcomes.GC_BATCH) -> int:
        """Clear up to ``limit`` expired outcome records, oldest first, in one
        transaction (a consumer's maintenance step runs it); returns how many. Expired
        flow key holds go with them: a one-at-a-time key whose at-most-once holder's run
        lapsed passes to its next item (:mod:`quickzones.store.flow_key_lapses`)."""
        now = self._now()
        turn = flow_key_lapses.turn_taker(self.items)  # lapsed one-at-a-time holds pass on
        return run(
            self.kv, lambda tr: outcomes.collect_expired(tr, self.keys, now, limit, take_turn=turn)
        )

    def _now(self) -> int:
        return now_ms(self.clock)

    def cancel(self, app: str, tenant: str, item_id: str) -> None:
        """Delete an item by id, leased or not; ItemNotFound if it is not there. A local
        consumer holding it hears of it at once: it never starts it, and a handler that
        runs it sees ``ctx.cancelled`` now (others' consumers find out by a read)."""
        zone = self.zone(app, tenant)
        self.items.complete(zone, check_name("item_id", item_id), None)
        for consumer in list(self._consumers):
            heard = getattr(consumer, "item_cancelled", None)  # consumers; not long polls
            if heard is not None:
                heard(zone, item_id)

    # --- consumers ---------------------------------------------------------------------

    def item_store(self) -> ZoneStore:
        """The zone store consumers take items from (the injected one, or the KV zones)."""
        return self.items

    def consumer(
        self,
        config: ConsumerConfig | None = None,
        *,
        election: Election | None = None,
        observer: Observer | None = None,
        name: str | None = None,
        also: Sequence[Quick] = (),
        heartbeat_s: float = HEARTBEAT_S,
    ) -> Consumer:
        """A consumer of this store's top-level queue and, with ``also``, of other
        clusters' too: the scanner visits every cluster's shards in shuffled order. The
        handlers are this Quick's. ``heartbeat_s`` is for tests: how often the consumer
        writes its heartbeat and pickup counts (``HEARTBEAT_S``, 5 s, otherwise)."""
        self.store_type_policies()
        consumer = Consumer(
            self.item_store(),
            self.toplevel,
            self.registry,
            kv=self.kv,
            config=config,
            clock=self.clock,
            election=election,
            observer=observer,
            name=name,
            limits=self.limits,
            more_clusters=[Cluster(o.items, o.toplevel, o.kv) for o in also],
            heartbeat_s=heartbeat_s,
        )
        consumer.manager.pauses = self.pauses  # every visit holds back what is paused
        consumer.manager.weighing.weights = self.tenant_weights  # and weighs the tenants
        consumer.manager.tenant_admission.limits = self.tenant_limit_store  # and limits them
        consumer.worker.gate.named = self.named_limits  # its workers take named limits' slots
        for source in (self, *also):
            source.wake_on_enqueue(consumer)  # their enqueues wake it
        return consumer

    def run_until_idle(self, config: ConsumerConfig | None = None) -> int:
        """Drain every vested item in this thread (tests, scripts): those of application
        transactions that committed before the call included, whose pointers this
        process's part two moves after their COMMITs (waited for here, a second at most,
        where the store runs it on a thread of its own: PostgreSQL's ``enqueue_on``)."""
        settle = getattr(self.kv, "settle_after_commits", None)
        if settle is not None:
            settle(SETTLE_AFTER_COMMITS_S)
        return self.consumer(config or ConsumerConfig(in_order=True)).run_until_idle()

    # --- admin -------------------------------------------------------------------------

    def dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]:
        """Dead letters of every zone, one app, one tenant (of any app), or one zone, of
        one job type, at most ``limit``: every filter given filters."""
        from quickzones.store.admin import list_dead_letters

        return list_dead_letters(self, *_filters(app, tenant), **_selection(job_type, limit))

    def dead_letter_page(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        item_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[DeadLetter]:
        """One page of :meth:`dead_letters`, in (app, tenant, id) order, at most ``limit``
        letters from ``cursor`` (the ``next_cursor`` of the page before; ``None``: the
        first page). It reads what it shows (plus a bounded number of letters a job-type
        or id filter passes over), however many letters lie behind it; a page may be
        short and still have a next one: the list ends where ``next_cursor`` is ``None``.
        :class:`InvalidArgument` for a cursor that is not one of this list's."""
        from quickzones.store.admin import dead_letter_page

        return dead_letter_page(
            self,
            *_filters(app, tenant),
            job_type=job_type,
            item_id=None if item_id is None else check_name("item_id", item_id),
            limit=limit,
            cursor=cursor,
        )

    def purge_dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete exactly the dead letters :meth:`dead_letters` lists with the same filters;
        returns how many."""
        from quickzones.store.admin import purge_dead_letters

        return purge_dead_letters(self, *_filters(app, tenant), **_selection(job_type, limit))

    def requeue_dead_letter(self, app: str, tenant: str, item_id: str) -> str:
        """Put one dead letter back into its zone (:class:`ItemAlreadyQueued` when its id
        is queued there again: the letter is kept)."""
        from quickzones.store.admin import requeue_dead_letter

        return requeue_dead_letter(self, self.zone(app, tenant), item_id)

    def requeue_dead_letters(
        self,
        app: str | None = None,
        tenant: str | None = None,
        *,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> Requeued:
        """Put back into their zones the dead letters :meth:`dead_letters` lists with the
        same filters, in bounded transactions; letters whose id is queued again are kept
        and reported in the result, as are corrupt ones."""
        from quickzones.store.admin import requeue_dead_letters

        return requeue_dead_letters(self, *_filters(app, tenant), **_selection(job_type, limit))

    # --- named limits (docs/limits.md) ------------------------------------------------

    def set_limit(
        self,
        app: str,
        name: str,
        *,
        concurrency: int | None = None,
        per_tenant: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
    ) -> Limit:
        """Declare (or change) ``app``'s limit ``name``, shared by every job type that
        names it (``q.job(..., limits=[name], cost=n)``): at most ``concurrency`` slots
        held at once across every consumer, at most ``per_tenant`` of them by one tenant,
        at most ``rate`` slots started per ``per`` seconds; a run takes its type's cost
        of slots. Every consumer enforces a change within about a second."""
        limit = Limit.of(
            app, name, concurrency=concurrency, per_tenant=per_tenant, rate=rate, per=per
        )
        return self.named_limits.set(limit)

    def delete_limit(self, app: str, name: str) -> bool:
        """Drop ``app``'s limit ``name``; False when there was none. Job types still
        naming it hold their items back until it is declared again."""
        return self.named_limits.delete(app, name)

    def get_limit(self, app: str, name: str) -> Limit | None:
        """``app``'s limit ``name`` as stored now (None: not defined)."""
        return self.named_limits.get(app, name)

    def list_limits(self, app: str | None = None) -> list[Limit]:
        """Every named limit (of ``app``)."""
        return self.named_limits.list(app)


def _type_policy(policy: outcomes.Policy, job: JobType) -> TypePolicy:
    ttl_ms = None if job.ttl_s is None else int(job.ttl_s * 1000)
    return TypePolicy(policy, job.delivery, ttl_ms)


def _filters(app: str | None, tenant: str | None) -> tuple[str | None, str | None]:
    return (
        None if app is None else check_name("app", app),
        None if tenant is None else check_name("tenant", tenant),
    )


def _count(payloads: Iterable[Any], seen: int) -> str:
    """How many payloads a batch has, for an error message (an iterator: "seen or more")."""
    return str(len(payloads)) if isinstance(payloads, Sized) else f"{seen} or more"


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(name, value, "must be True or False")
    return value


def _selection(job_type: str | None, limit: int | None) -> dict[str, Any]:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgument("limit", limit, "must be a whole number of at least 1")
    return {
        "job_type": None if job_type is None else check_job_type(job_type),
        "limit": limit,
    }

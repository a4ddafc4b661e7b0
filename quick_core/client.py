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

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from quick_core.clock import Clock, SystemClock
from quick_core.consumer import Cluster, Consumer, ConsumerConfig, Observer
from quick_core.election import Election
from quick_core.errors import InvalidArgument, UnknownJobType
from quick_core.keys import KeySpace
from quick_core.kv import KVStore, KVTransaction, run
from quick_core.limits import AppLimits, Limits
from quick_core.records import DeadLetter, WorkItem, ZoneId
from quick_core.registry import Handler, JobType, Registry, RetryPolicy
from quick_core.toplevel import TopLevelQueue
from quick_core.tracing import TRACE_KEY, enqueue_span
from quick_core.urls import open_kv
from quick_core.validation import (
    DEFAULT_MAX_PAYLOAD,
    check_job_type,
    check_name,
    check_priority,
    check_seconds,
    encode_payload,
)
from quick_core.zones import KVZoneStore, new_item_id
from quick_core.zonestore import NewItem, ZoneStore

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _PendingPull:
    zone: ZoneId
    vesting_ms: int


class Quick:
    """A QuiCK deployment: one KV store holding zones and a top-level queue."""

    def __init__(
        self,
        kv: KVStore,
        *,
        clock: Clock | None = None,
        cluster: str = "default",
        shards: int = 1,
        root: str = "quick",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        strict_job_types: bool = False,
        fifo: bool = False,
    ) -> None:
        self.kv = kv
        self.clock = clock or SystemClock()
        self.keys = KeySpace(root)
        self.toplevel = TopLevelQueue(
            kv, keys=self.keys, cluster=cluster, shards=shards, clock=self.clock
        )
        self.zones = KVZoneStore(kv, self.toplevel, keys=self.keys, clock=self.clock)
        self.registry = Registry()
        self.max_payload = max_payload
        # With strict job types an enqueue of an unregistered type fails at once; producers
        # that do not import the handlers leave it off.
        self.strict_job_types = strict_job_types
        # FIFO: this client's items without a delay are ordered within their priority by
        # commit versionstamp, not by the producer's clock (docs/guarantees.md#ordering).
        self.fifo = fifo
        self._pending = threading.local()
        self.limits = Limits(kv, self.keys, self.clock)

    @classmethod
    def open(cls, url: str, *, clock: Clock | None = None, **options: Any) -> Quick:
        """Open the store a URL names: ``memory://``, ``sqlite:///path``, ``fdb://``."""
        return cls(open_kv(url, clock=clock), clock=clock, **options)

    def close(self) -> None:
        self.kv.close()

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
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(payload, ctx)`` for a job type.

        A transactional handler gets ``ctx.tr``; its writes and the item's completion
        commit in one transaction (exactly once). ``delivery="at_most_once"`` deletes the
        item when its lease is taken, so it never runs twice (and may not run at all).
        """

        def register(fn: Handler) -> Handler:
            self.registry.register(
                JobType(
                    name=name,
                    handler=fn,
                    retry=retry or RetryPolicy(),
                    max_concurrency=max_concurrency,
                    pool_max_concurrency=pool_max_concurrency,
                    execution_bound_s=execution_bound_s,
                    transactional=transactional,
                    delivery=delivery,
                    ttl_s=ttl_s,
                )
            )
            return fn

        return register

    # --- enqueue -----------------------------------------------------------------------

    def _new_item(
        self,
        job_type: str,
        payload: Any,
        delay: float,
        priority: int,
        item_id: str | None,
        ttl: float | None,
        fifo: bool | None = None,
    ) -> NewItem:
        check_job_type(job_type)
        job = self.registry.find(job_type)
        if job is None and self.strict_job_types:
            raise UnknownJobType(job_type)
        delay_s = check_seconds("delay", delay)
        check_priority(priority)
        if item_id is not None:
            check_name("item_id", item_id)
        else:
            # Chosen before the transaction runs, so a retry after commit_unknown_result
            # finds the item it already wrote instead of writing a second one.
            item_id = new_item_id()
        ttl_s = ttl if ttl is not None else (job.ttl_s if job is not None else None)
        if ttl_s is not None:
            check_seconds("ttl", ttl_s)
        body, content_type = encode_payload(payload, self.max_payload)
        return NewItem(
            job_type=job_type,
            payload=body,
            delay_ms=int(delay_s * 1000),
            priority=priority,
            item_id=item_id,
            content_type=content_type,
            ttl_ms=None if ttl_s is None else int(ttl_s * 1000),
            delivery=job.delivery if job is not None else "at_least_once",
            fifo=self.fifo if fifo is None else _check_flag("fifo", fifo),
        )

    def enqueue(
        self,
        job_type: str,
        payload: Any = b"",
        *,
        app: str,
        tenant: str,
        delay: float = 0.0,
        priority: int = 0,
        item_id: str | None = None,
        ttl: float | None = None,
        tr: KVTransaction | None = None,
        fifo: bool | None = None,
    ) -> str:
        """Enqueue one item into the zone (app, tenant); returns its id.

        Without ``tr`` it commits on its own. With ``tr`` it joins the caller's transaction
        (reading the pointer index, never a pointer record, so no consumer's pointer lease
        can abort it); run the transaction with :meth:`transact` so the pointer's vesting
        time is pulled earlier after the commit. A caller-chosen ``item_id`` makes the
        enqueue idempotent. ``fifo`` (default: the client's) orders an item without a
        delay by its commit among the priority's other FIFO items.
        """
        zone = ZoneId(check_name("app", app), check_name("tenant", tenant))
        new = self._new_item(job_type, payload, delay, priority, item_id, ttl, fifo)
        with enqueue_span(job_type, zone) as carrier:
            if carrier:
                new = replace(new, meta={**new.meta, TRACE_KEY: carrier})
            return self._enqueue_traced(zone, new, tr)

    def _enqueue_traced(self, zone: ZoneId, new: NewItem, tr: KVTransaction | None) -> str:
        if tr is None:
            item_id_out, vesting, needs_pull = run(
                self.kv, lambda t: self._enqueue_in(t, zone, new)
            )
            if needs_pull:
                self.toplevel.pull_pointer_earlier(zone, vesting)
            return item_id_out
        item_id_out, vesting, needs_pull = self._enqueue_in(tr, zone, new)
        pending: list[_PendingPull] | None = getattr(self._pending, "pulls", None)
        if needs_pull and pending is not None:
            pending.append(_PendingPull(zone, vesting))
        return item_id_out

    def _enqueue_in(self, tr: KVTransaction, zone: ZoneId, new: NewItem) -> tuple[str, int, bool]:
        self.limits.charge_enqueue(tr, zone.app)
        return self.zones.enqueue_in(tr, zone, new)

    def set_limits(self, app: str, limits: AppLimits) -> None:
        """Per-app enqueue and dispatch rates and a pool-wide concurrency cap, enforced
        across every producer and consumer of this store."""
        self.limits.set(check_name("app", app), limits)

    def enqueue_local(
        self, job_type: str, payload: Any = b"", *, shard: int = 0, delay: float = 0.0
    ) -> str:
        """Enqueue a local work item: work about the cluster itself (maintenance, sweeps)
        kept in the top-level queue's own key range, run by the same consumers."""
        zone = self.toplevel.local_zone(shard)
        return self.zones.enqueue(zone, self._new_item(job_type, payload, delay, 0, None, None))

    def enqueue_many(
        self,
        job_type: str,
        payloads: Iterable[Any],
        *,
        app: str,
        tenant: str,
        delay: float = 0.0,
        priority: int = 0,
        fifo: bool | None = None,
    ) -> list[str]:
        """Enqueue several items into one zone in one transaction (with ``fifo``, in the
        order given)."""
        zone = ZoneId(check_name("app", app), check_name("tenant", tenant))
        items = [self._new_item(job_type, p, delay, priority, None, None, fifo) for p in payloads]

        def write(tr: KVTransaction) -> tuple[list[str], int, bool]:
            ids, earliest = [], 2**62
            self.limits.charge_enqueue(tr, zone.app, len(items))
            for item in items:
                item_id, vesting, _ = self.zones.enqueue_in(tr, zone, item, pointer=False)
                ids.append(item_id)
                earliest = min(earliest, vesting)
            if not ids:
                return ids, earliest, False
            return ids, earliest, self.toplevel.ensure_pointer(tr, zone, earliest)

        ids, earliest, needs_pull = run(self.kv, write)
        if needs_pull and ids:
            self.toplevel.pull_pointer_earlier(zone, earliest)
        return ids

    def transact(self, fn: Callable[[KVTransaction], T]) -> T:
        """Run ``fn(tr)`` in one transaction with retries; enqueues made inside it commit
        with the caller's own writes, or not at all."""
        outer: list[_PendingPull] | None = getattr(self._pending, "pulls", None)
        pulls: list[_PendingPull] = []

        def attempt(tr: KVTransaction) -> T:
            pulls.clear()
            return fn(tr)

        self._pending.pulls = pulls
        try:
            result = run(self.kv, attempt)
        finally:
            self._pending.pulls = outer
        for pull in pulls:
            self.toplevel.pull_pointer_earlier(pull.zone, pull.vesting_ms)
        return result

    # --- zone operations ---------------------------------------------------------------

    def zone(self, app: str, tenant: str) -> ZoneId:
        return ZoneId(check_name("app", app), check_name("tenant", tenant))

    def get(self, app: str, tenant: str, item_id: str) -> WorkItem | None:
        return self.zones.get(self.zone(app, tenant), item_id)

    def cancel(self, app: str, tenant: str, item_id: str) -> None:
        """Delete an item by id, leased or not; ItemNotFound if it is not there."""
        self.zones.cancel(self.zone(app, tenant), check_name("item_id", item_id))

    # --- consumers ---------------------------------------------------------------------

    def item_store(self) -> ZoneStore:
        """The zone store consumers take items from: the KV zones here; a subclass whose
        items live elsewhere (``adapters.cassandra``) returns its own."""
        return self.zones

    def consumer(
        self,
        config: ConsumerConfig | None = None,
        *,
        election: Election | None = None,
        observer: Observer | None = None,
        name: str | None = None,
        also: Sequence[Quick] = (),
    ) -> Consumer:
        """A consumer of this store's top-level queue and, with ``also``, of other
        clusters' too: the scanner visits every cluster's shards in shuffled order. The
        handlers are this Quick's."""
        return Consumer(
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
            more_clusters=[Cluster(o.zones, o.toplevel, o.kv) for o in also],
        )

    def run_until_idle(self, config: ConsumerConfig | None = None) -> int:
        """Drain every vested item in this thread (tests, scripts)."""
        return self.consumer(config or ConsumerConfig(in_order=True)).run_until_idle()

    # --- admin -------------------------------------------------------------------------

    def dead_letters(self, app: str | None = None, tenant: str | None = None) -> list[DeadLetter]:
        from quick_core.admin import list_dead_letters

        return list_dead_letters(self, app, tenant)

    def requeue_dead_letter(self, app: str, tenant: str, item_id: str) -> str:
        from quick_core.admin import requeue_dead_letter

        return requeue_dead_letter(self, self.zone(app, tenant), item_id)


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(name, value, "must be True or False")
    return value

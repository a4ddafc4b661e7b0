"""Consumers: the Scanner (paper Algorithm 1), Managers (Algorithm 2) and Workers
(Algorithm 3).

The three steps are plain methods (:meth:`Consumer.scan_once`, :meth:`Consumer.visit`,
:meth:`Consumer.execute`) so a test or the simulator can drive them in one thread;
:meth:`Consumer.start` runs them on threads: one scanner, a pool of managers, a pool of
workers, a lease extender and a completion flusher.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import signal
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from quick_core.clock import Clock, SystemClock, now_ms
from quick_core.consumer_config import ConsumerConfig as ConsumerConfig
from quick_core.election import Election, LocalElection, new_candidate_id
from quick_core.errors import (
    ItemNotFound,
    LeaseLost,
    Nack,
    PermanentError,
    QuickError,
    StorageError,
    ZoneLeaseFailed,
)
from quick_core.interrupt import (
    ExecutionBoundExceeded,
    HandlerInterrupted,
    LeaseInterrupted,
    ShutdownInterrupted,
    interrupt_thread,
)
from quick_core.kv import KVStore, run
from quick_core.limits import Limits
from quick_core.pool import DaemonPool
from quick_core.records import WorkItem, ZoneId
from quick_core.registry import JobContext, JobType, Registry, RetryPolicy
from quick_core.scanner_election import ScannerElection
from quick_core.toplevel import PointerRef, TopLevelQueue
from quick_core.tracing import run_span
from quick_core.zonestore import ZoneStore

log = logging.getLogger("quick.consumer")

_SHARED_LOCAL_ELECTION = LocalElection()

# Consumer events that drop or delay work: each is logged once, at INFO, by name.
LOGGED_EVENTS = frozenset(
    {
        "dead_lettered",
        "requeued",
        "nacked",
        "throttled",
        "lease_lost",
        "released",
        "failed",
        "pointer_deleted",
        "dequeue_error",
        "requeue_error",
        "complete_error",
    }
)


@dataclass(frozen=True, slots=True)
class Cluster:
    """One store a consumer polls: its zones and its top-level queue (paper: a cluster)."""

    zones: ZoneStore
    toplevel: TopLevelQueue
    kv: KVStore | None = None

    @property
    def name(self) -> str:
        return self.toplevel.cluster


@dataclass(slots=True)
class Work:
    """One leased item handed from a Manager to a Worker."""

    zone: ZoneId
    item: WorkItem
    dequeued_at: float
    app_slot: bool = False  # holds one of its app's pool-wide concurrency slots
    cluster: str = "default"


@dataclass(slots=True)
class _Running:
    work: Work
    thread_id: int
    started: float
    deadline: float | None
    lease_lost: threading.Event = field(default_factory=threading.Event)
    interrupted: bool = False


Observer = Callable[[str, dict[str, Any]], None]


class Consumer:
    """Polls a top-level queue and runs the items of the zones it points to."""

    def __init__(
        self,
        zones: ZoneStore,
        toplevel: TopLevelQueue,
        registry: Registry,
        *,
        kv: KVStore | None = None,
        config: ConsumerConfig | None = None,
        clock: Clock | None = None,
        election: Election | None = None,
        observer: Observer | None = None,
        name: str | None = None,
        limits: Limits | None = None,
        more_clusters: Sequence[Cluster] = (),
    ) -> None:
        self.zones = zones
        self.toplevel = toplevel
        self.clusters: dict[str, Cluster] = {toplevel.cluster: Cluster(zones, toplevel, kv)}
        for extra in more_clusters:
            if extra.name in self.clusters:
                from quick_core.errors import ConfigurationError

                raise ConfigurationError(f"cluster {extra.name!r} given twice")
            self.clusters[extra.name] = extra
        self.registry = registry
        self.kv = kv
        self.config = config or ConsumerConfig()
        self.config.validate()
        self.clock = clock or SystemClock()
        self.observer = observer
        self.limits = limits
        self._slots: Counter[tuple[str, str]] = Counter()
        self.name = name or new_candidate_id()
        self.rng = random.Random(self.config.seed)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._type_in_flight: Counter[str] = Counter()
        self._running: dict[int, _Running] = {}
        self._completions: queue.Queue[tuple[Work, JobType | None]] = queue.Queue()
        self.election = election if election is not None else _SHARED_LOCAL_ELECTION
        self.scanner_election = ScannerElection(
            self.election,
            self.name,
            self.clock,
            forced=self.config.in_order,
            ttl_s=self.config.election_ttl_s,
        )
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._managers: DaemonPool | None = None
        self._workers: DaemonPool | None = None
        self._pending: set[int] = set()
        self._batching = False  # run_until_idle completes a visit's items in one batch

    # --- observation -------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        self.stats[event] += 1
        if event in LOGGED_EVENTS:
            # One line per decision that drops or delays work, with a stable event name
            # and fields (never payloads) in ``extra`` for structured log handlers.
            shown = {k: str(v) for k, v in fields.items()}
            log.info(
                "%s %s",
                event,
                " ".join(f"{k}={v}" for k, v in shown.items()),
                extra={"quick_event": event, "quick_fields": shown},
            )
        if self.observer is not None:
            try:
                self.observer(event, fields)
            except Exception:  # an observer must never break the consumer
                log.exception("observer failed on %s", event)

    # --- election ----------------------------------------------------------------------

    @property
    def in_order(self) -> bool:
        """Whether this consumer is the in-order scanner of its first cluster."""
        return self.in_order_for(self.toplevel.cluster)

    def in_order_for(self, cluster: str) -> bool:
        return self.scanner_election.holds(cluster)

    def refresh_election(self) -> None:
        """Acquire or renew the in-order scanner lease of each cluster's top-level queue."""
        self.scanner_election.refresh(list(self.clusters))

    # --- Algorithm 1: the scanner ------------------------------------------------------

    def capacity(self) -> int:
        with self._lock:
            return max(0, self.config.processing_bound - self._in_flight)

    def scan_once(self) -> list[PointerRef]:
        """Peek the shards of every cluster (shuffled) and choose pointers to visit.

        In random mode, a random ``selection_frac`` of each shard's peeked pointers (at
        most ``selection_max`` in all) so that consumers spread over zones. In order mode
        (this consumer holds a cluster's election), the oldest vested pointers across all
        that cluster's shards first, so no pointer starves (invariant 10).
        """
        cfg = self.config
        targets = [(c, shard) for c in self.clusters.values() for shard in range(c.toplevel.shards)]
        self.rng.shuffle(targets)
        ordered: list[PointerRef] = []
        sampled: list[PointerRef] = []
        any_in_order = False
        for cluster, shard in targets:
            in_order = self.in_order_for(cluster.name)
            any_in_order = any_in_order or in_order
            if not in_order and len(sampled) >= cfg.selection_max:
                continue
            try:
                peeked = cluster.toplevel.peek_pointers(shard, cfg.peek_max)
            except StorageError as err:
                self._emit("scan_error", error=str(err))
                continue
            if not peeked:
                continue
            if in_order:
                ordered.extend(peeked)
            else:
                room = cfg.selection_max - len(sampled)
                k = min(room, len(peeked), max(1, math.ceil(cfg.selection_frac * len(peeked))))
                sampled.extend(self.rng.sample(peeked, k))
        ordered.sort(key=lambda ref: ref.vesting_ms)
        chosen = ordered[: cfg.selection_max]
        chosen += sampled[: cfg.selection_max - len(chosen)]
        self._emit("scan", pointers=len(chosen), in_order=any_in_order)
        return chosen

    # --- Algorithm 2: a manager's visit to one zone --------------------------------------

    def _resolve(self, item: WorkItem) -> WorkItem:
        """Apply this consumer's job type options to an item whose producer did not know
        them: a producer need not import the handlers to enqueue for an at-most-once or
        TTL job type."""
        job = self.registry.find(item.job_type)
        if job is None:
            return item
        changes: dict[str, Any] = {}
        if job.delivery == "at_most_once" and item.delivery != "at_most_once":
            changes["delivery"] = "at_most_once"
        if job.ttl_s is not None and item.deadline_ms is None:
            changes["deadline_ms"] = item.enqueued_ms + int(job.ttl_s * 1000)
        return item.with_(**changes) if changes else item

    def _accept(self, taken: Counter[str]) -> Callable[[WorkItem], bool]:
        def accept(item: WorkItem) -> bool:
            job = self.registry.find(item.job_type)
            if job is None or job.max_concurrency is None:
                return True
            with self._lock:
                busy = self._type_in_flight[item.job_type] + taken[item.job_type]
            if busy >= job.max_concurrency:
                return False
            taken[item.job_type] += 1
            return True

        return accept

    def visit(self, ref: PointerRef) -> list[Work]:
        """Lease the pointer, dequeue up to ``dequeue_max`` items, requeue the pointer at the
        zone's minimum vesting time or collect it if the zone stayed empty."""
        cfg = self.config
        room = min(cfg.dequeue_max, self.capacity())
        if room <= 0:
            return []
        cluster = self.clusters[ref.cluster]
        try:
            pointer = cluster.toplevel.obtain_pointer_lease(ref, int(cfg.pointer_lease_s * 1000))
        except ZoneLeaseFailed as err:
            self._emit("pointer_lease_failed", reason=err.reason)
            return []
        zone = pointer.zone
        pointer_vested_ms = ref.vesting_ms
        self._emit("pointer_leased", zone=zone, lag_ms=now_ms(self.clock) - pointer_vested_ms)
        items: list[WorkItem] = []
        room, not_before, app_slots = self._apply_app_limits(zone, room)
        try:
            if room > 0:
                items, corrupt = cluster.zones.dequeue(
                    zone,
                    room,
                    int(cfg.item_lease_s * 1000),
                    accept=self._accept(Counter()),
                    resolve=self._resolve,
                )
            else:
                corrupt = []
            for bad in corrupt:
                log.warning(
                    "dead-lettered corrupt item %s in %s: %s", bad.item_id, zone, bad.reason
                )
                self._emit("dead_lettered", zone=zone, item_id=bad.item_id, reason="corrupt")
        except StorageError as err:
            self._emit("dequeue_error", zone=zone, error=str(err))
        if app_slots > len(items):
            self._release_slots("app", zone.app, app_slots - len(items))

        def min_vesting(tr: Any) -> int | None:
            earliest = cluster.zones.min_vesting_in(tr, zone)
            if earliest is None or not_before is None:
                return earliest
            return max(earliest, not_before)  # a rate-limited app waits for its next window

        try:
            outcome = cluster.toplevel.requeue_pointer(
                pointer,
                min_vesting,
                lambda tr: cluster.zones.zone_is_empty(tr, zone),
                min_inactive_ms=int(cfg.min_inactive_s * 1000),
                active=bool(items),
            )
            self._emit("pointer_" + outcome, zone=zone)
        except StorageError as err:
            # The pointer lease simply expires and the pointer vests again.
            self._emit("pointer_requeue_error", zone=zone, error=str(err))
        now = self.clock.now()
        works = [
            Work(zone, item, now, app_slot=app_slots > 0, cluster=cluster.name) for item in items
        ]
        with self._lock:
            self._in_flight += len(works)
            for w in works:
                self._type_in_flight[w.item.job_type] += 1
        for w in works:
            self._emit(
                "dequeued",
                zone=zone,
                item_id=w.item.item_id,
                job_type=w.item.job_type,
                enqueued_ms=w.item.enqueued_ms,
                pickup_ms=now_ms(self.clock),
            )
        return works

    def _apply_app_limits(self, zone: ZoneId, room: int) -> tuple[int, int | None, int]:
        """Cut ``room`` to the app's dispatch rate and pool-wide concurrency cap.

        Returns (room, not_before_ms, app_slots_taken); ``not_before_ms`` is set when the
        app's rate limit is what stopped it, so its pointer waits for the next window.
        """
        if self.limits is None:
            return room, None, 0
        try:
            limits = self.limits.get(zone.app)
            not_before = None
            taken = 0
            if limits.max_concurrency is not None:
                taken = self._acquire_slots("app", zone.app, room, limits.max_concurrency)
                room = taken
                if room == 0:
                    self._emit("throttled", zone=zone, reason="app concurrency cap")
            if room > 0 and limits.dispatches_per_second is not None:
                granted, window = self.limits.grant_dispatch(zone.app, room)
                if granted < room:
                    not_before = window
                    self._emit("throttled", zone=zone, reason="app dispatch rate")
                    if taken > granted:
                        self._release_slots("app", zone.app, taken - granted)
                        taken = granted
                room = granted
            return room, not_before, taken
        except StorageError as err:
            self._emit("limits_error", zone=zone, error=str(err))
            return 0, None, 0

    def _slot_ttl_ms(self) -> int:
        return int(max(10.0, self.config.item_lease_s) * 1000)

    def _acquire_slots(self, scope: str, name: str, wanted: int, cap: int) -> int:
        assert self.limits is not None
        got = self.limits.acquire_slots(scope, name, self.name, wanted, cap, self._slot_ttl_ms())
        if got:
            with self._lock:
                self._slots[(scope, name)] += got
        return got

    def _release_slots(self, scope: str, name: str, n: int) -> None:
        if self.limits is None or n <= 0:
            return
        with self._lock:
            self._slots[(scope, name)] -= n
        try:
            self.limits.release_slots(scope, name, self.name, n, self._slot_ttl_ms())
        except StorageError:
            pass  # the slot record lapses after its TTL

    # --- Algorithm 3: a worker runs one item ---------------------------------------------

    def _release(self, work: Work) -> None:
        with self._lock:
            self._in_flight -= 1
            self._type_in_flight[work.item.job_type] -= 1
        if work.app_slot:
            self._release_slots("app", work.zone.app, 1)

    def execute(self, work: Work) -> str:
        """Run one leased item; returns the outcome ("completed", "requeued",
        "dead_lettered", "lease_lost", "released")."""
        try:
            return self._execute(work)
        finally:
            self._release(work)

    def _execute(self, work: Work) -> str:
        zone, item = work.zone, work.item
        if self._stopping.is_set() and self._workers is not None:
            return self._give_back(work)
        job = self.registry.find(item.job_type)
        if item.delivery == "at_least_once" and not self._lease_still_held(work):
            self._emit("lease_lost", zone=zone, item_id=item.item_id, where="before_start")
            return "lease_lost"
        if item.deadline_ms is not None and now_ms(self.clock) > item.deadline_ms:
            # It waited past its TTL in this consumer's local queue: never run late.
            return self._fail(work, job, "expired: not started before its TTL", permanent=True)
        self._emit("started", zone=zone, item_id=item.item_id, job_type=item.job_type)
        if job is None:
            return self._fail(work, None, f"unknown job type {item.job_type!r}", permanent=False)
        if job.pool_max_concurrency is not None and self.limits is not None:
            if not self._acquire_slots("type", job.name, 1, job.pool_max_concurrency):
                self._emit("throttled", zone=zone, reason="job type concurrency cap")
                return self._give_back(work, delay_ms=100)
            try:
                return self._run_job(work, job)
            finally:
                self._release_slots("type", job.name, 1)
        return self._run_job(work, job)

    def _run_job(self, work: Work, job: JobType) -> str:
        with run_span(work.item, work.zone):
            return self._run_job_traced(work, job)

    def _run_job_traced(self, work: Work, job: JobType) -> str:
        zone, item = work.zone, work.item
        attempt = 0
        while True:
            error: BaseException | None = None
            try:
                if job.transactional:
                    self._run_transactional(work, job)
                    self._emit("completed", zone=zone, item_id=item.item_id)
                    return "completed"
                self._run_handler(work, job, None)
            except LeaseInterrupted:
                self._emit("lease_lost", zone=zone, item_id=item.item_id, where="running")
                return "lease_lost"
            except ShutdownInterrupted:
                return self._give_back(work)
            except ExecutionBoundExceeded:
                error = TimeoutError(f"exceeded execution bound of {job.execution_bound_s}s")
            except (LeaseLost, ItemNotFound) as err:
                self._emit("lease_lost", zone=zone, item_id=item.item_id, where=type(err).__name__)
                return "lease_lost"
            except PermanentError as err:
                return self._fail(work, job, _describe(err), permanent=True)
            except Nack as nack:
                return self._nack(work, nack)
            except Exception as err:
                error = err
            if error is None:
                if item.delivery == "at_most_once":
                    self._emit("completed", zone=zone, item_id=item.item_id)
                    return "completed"
                self._completions.put((work, job))
                if self._workers is None and not self._batching:
                    self.flush_completions()
                return "completed"
            if attempt < job.retry.inline_retries and not self._stopping.is_set():
                attempt += 1
                self._emit("retried_inline", zone=zone, item_id=item.item_id)
                continue
            return self._fail(work, job, _describe(error), permanent=False)

    def _lease_still_held(self, work: Work) -> bool:
        """Re-check the lease before starting: an item that waited past its lease in the
        local queue extends it first (which fails if someone else leased it since)."""
        if work.item.vesting_ms - now_ms(self.clock) > 1000:
            return True
        try:
            work.item = self.clusters[work.cluster].zones.extend_lease(
                work.zone,
                work.item.item_id,
                work.item.lease_id or "",
                int(self.config.item_lease_s * 1000),
            )
            return True
        except (LeaseLost, ItemNotFound):
            return False
        except StorageError:
            return True  # the extender will retry; completing checks the lease anyway

    def _run_handler(self, work: Work, job: JobType, tr: Any) -> Any:
        thread_id = threading.get_ident()
        now = self.clock.now()
        running = _Running(
            work,
            thread_id,
            now,
            None if job.execution_bound_s is None else time.monotonic() + job.execution_bound_s,
        )
        ctx = JobContext(work.zone, work.item, tr=tr, lease_lost=running.lease_lost)
        with self._lock:
            self._running[thread_id] = running
        try:
            return job.call(ctx)
        finally:
            with self._lock:
                self._running.pop(thread_id, None)

    def _run_transactional(self, work: Work, job: JobType) -> None:
        """Handler effects and the completion commit in one KV transaction (invariant 9)."""
        cluster = self.clusters[work.cluster]
        if cluster.kv is None:
            raise QuickError("transactional handlers need a KV zone store")

        def body(tr: Any) -> None:
            self._run_handler(work, job, tr)
            cluster.zones.complete(work.zone, work.item.item_id, work.item.lease_id, tr=tr)

        run(cluster.kv, body)

    def _fail(self, work: Work, job: JobType | None, reason: str, *, permanent: bool) -> str:
        zone, item = work.zone, work.item
        if item.delivery == "at_most_once":
            self._emit("failed", zone=zone, item_id=item.item_id, reason=reason, redelivered=False)
            return "failed"
        cluster = self.clusters[work.cluster]
        policy = job.retry if job is not None else RetryPolicy()
        errors = item.error_count + 1
        age_s = self.clock.now() - item.enqueued_ms / 1000
        try:
            if permanent or policy.gives_up(errors, age_s):
                cluster.zones.dead_letter(zone, item.item_id, item.lease_id, reason)
                self._emit("dead_lettered", zone=zone, item_id=item.item_id, reason=reason)
                return "dead_lettered"
            delay = policy.backoff_s(errors, self.rng)
            requeued = cluster.zones.requeue(
                zone, item.item_id, item.lease_id or "", int(delay * 1000), error=reason
            )
            # The pointer was requeued at this item's lease end; bring it forward.
            cluster.toplevel.pull_pointer_earlier(zone, requeued.vesting_ms)
            self._emit("requeued", zone=zone, item_id=item.item_id, delay_s=delay)
            return "requeued"
        except (LeaseLost, ItemNotFound):
            self._emit("lease_lost", zone=zone, item_id=item.item_id, where="fail")
            return "lease_lost"
        except StorageError as err:
            # The lease expires and the item runs again: at-least-once holds.
            self._emit("requeue_error", zone=zone, item_id=item.item_id, error=str(err))
            return "lease_lost"

    def _nack(self, work: Work, nack: Nack) -> str:
        zone, item = work.zone, work.item
        if item.delivery == "at_most_once":
            self._emit("failed", zone=zone, item_id=item.item_id, reason="nack", redelivered=False)
            return "failed"
        cluster = self.clusters[work.cluster]
        try:
            requeued = cluster.zones.requeue(
                zone,
                item.item_id,
                item.lease_id or "",
                int(max(0.0, nack.delay_s) * 1000),
                count_error=False,
                meta=nack.meta,
            )
        except (LeaseLost, ItemNotFound):
            self._emit("lease_lost", zone=zone, item_id=item.item_id, where="nack")
            return "lease_lost"
        except StorageError as err:
            self._emit("requeue_error", zone=zone, item_id=item.item_id, error=str(err))
            return "lease_lost"
        cluster.toplevel.pull_pointer_earlier(zone, requeued.vesting_ms)
        self._emit("nacked", zone=zone, item_id=item.item_id, delay_s=nack.delay_s)
        return "nacked"

    def _give_back(self, work: Work, delay_ms: int = 0) -> str:
        """Release a lease without counting an error (shutdown, throttling)."""
        cluster = self.clusters[work.cluster]
        try:
            released = cluster.zones.requeue(
                work.zone, work.item.item_id, work.item.lease_id or "", delay_ms, count_error=False
            )
            cluster.toplevel.pull_pointer_earlier(work.zone, released.vesting_ms)
        except (QuickError, OSError):
            pass  # the lease expires on its own
        self._emit("released", zone=work.zone, item_id=work.item.item_id)
        return "released"

    def flush_completions(self) -> int:
        """Complete every finished item, batched per zone in one transaction each."""
        batch: list[tuple[Work, JobType | None]] = []
        while True:
            try:
                batch.append(self._completions.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return 0
        by_zone: dict[tuple[str, ZoneId], list[Work]] = defaultdict(list)
        for work, _ in batch:
            by_zone[(work.cluster, work.zone)].append(work)
        for (cluster, zone), works in by_zone.items():
            try:
                outcomes = self.clusters[cluster].zones.complete_many(
                    zone, [(w.item.item_id, w.item.lease_id or "") for w in works]
                )
            except StorageError as err:
                self._emit("complete_error", zone=zone, error=str(err))
                continue
            for w, outcome in zip(works, outcomes, strict=True):
                if outcome is None:
                    self._emit("completed", zone=zone, item_id=w.item.item_id)
                else:
                    self._emit("lease_lost", zone=zone, item_id=w.item.item_id, where="complete")
        return len(batch)

    # --- the lease extender ------------------------------------------------------------

    def refresh_slots_once(self) -> None:
        """Keep this consumer's pool-wide concurrency slots from lapsing."""
        if self.limits is None:
            return
        with self._lock:
            held = [(k, n) for k, n in self._slots.items() if n > 0]
        for (scope, name), n in held:
            try:
                self.limits.refresh_slots(scope, name, self.name, n, self._slot_ttl_ms())
            except StorageError as err:
                self._emit("limits_error", error=str(err))

    def extend_leases_once(self) -> None:
        """Extend the leases of running items near expiry; interrupt the handlers whose
        lease was lost or whose execution bound passed."""
        extend_s = self.config.lease_extend_s or self.config.item_lease_s / 3
        lease_ms = int(self.config.item_lease_s * 1000)
        with self._lock:
            running = list(self._running.values())
        mono = time.monotonic()
        for r in running:
            if r.interrupted:
                continue
            if r.deadline is not None and mono > r.deadline:
                r.interrupted = interrupt_thread(r.thread_id, ExecutionBoundExceeded)
                continue
            if r.work.item.delivery == "at_most_once":
                continue
            if (
                r.work.item.vesting_ms - now_ms(self.clock)
                > (self.config.item_lease_s - extend_s) * 1000
            ):
                continue
            try:
                r.work.item = self.clusters[r.work.cluster].zones.extend_lease(
                    r.work.zone, r.work.item.item_id, r.work.item.lease_id or "", lease_ms
                )
                self._emit("lease_extended", zone=r.work.zone, item_id=r.work.item.item_id)
            except (LeaseLost, ItemNotFound):
                r.lease_lost.set()
                r.interrupted = interrupt_thread(r.thread_id, LeaseInterrupted)
            except StorageError as err:
                self._emit("extend_error", error=str(err))

    # --- single-threaded driving ---------------------------------------------------------

    def run_until_idle(self, *, max_rounds: int = 10_000) -> int:
        """Scan, visit and execute in this thread until no vested pointer is left; returns
        the number of items run. For tests and the simulator."""
        done = 0
        for _ in range(max_rounds):
            self.refresh_election()
            refs = self.scan_once()
            if not refs:
                break
            self._batching = True
            try:
                for ref in refs:
                    for work in self.visit(ref):
                        self.execute(work)
                        done += 1
                    self.flush_completions()
            finally:
                self._batching = False
        return done

    # --- threaded runtime ----------------------------------------------------------------

    def start(self) -> None:
        """Start the scanner, extender and flusher threads and the manager/worker pools."""
        self._stopping.clear()
        self._managers = DaemonPool(self.config.managers, "quick-mgr")
        self._workers = DaemonPool(self.config.workers, "quick-wrk")
        for target, name in (
            (self._scanner_loop, "quick-scanner"),
            (self._extender_loop, "quick-extender"),
            (self._flusher_loop, "quick-flusher"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _scanner_loop(self) -> None:
        """Algorithm 1 on a thread. Pipelined (the default): the pointers a scan selects
        wait in a local queue and go to managers as they free up, and the next scan
        comes when that queue is empty (or its pointers are ``idle_sleep_s`` x 10 old),
        so no visit waits for the slowest visit of the last scan. Otherwise each scan
        waits for all of the last one's visits. A pass whose visits all took nothing
        (empty or throttled zones) sleeps ``idle_sleep_s``, so such zones are not polled
        hot."""
        cfg = self.config
        next_election = 0.0
        managers = self._managers
        assert managers is not None
        visiting: dict[Future[int], tuple[str, int, str]] = {}
        selected: deque[PointerRef] = deque()
        selected_at = 0.0
        while not self._stopping.is_set():
            mono = time.monotonic()
            if mono >= next_election:
                self.refresh_election()
                next_election = mono + cfg.election_ttl_s / 3
            finished = [f for f in visiting if f.done()]
            for f in finished:
                del visiting[f]
            took = [f.result() for f in finished if f.exception() is None]
            if finished and not visiting and not selected and not any(took):
                self._stopping.wait(cfg.idle_sleep_s)
                continue
            if visiting and not cfg.pipelined_scans:
                futures.wait(visiting, return_when=futures.ALL_COMPLETED)
                continue
            free = cfg.managers - len(visiting)
            submitted = 0
            if free > 0 and self.capacity() > 0:
                if not selected or mono - selected_at > cfg.idle_sleep_s * 10:
                    selected = deque(self.scan_once())
                    selected_at = time.monotonic()
                busy = set(visiting.values())
                while selected and submitted < free:
                    ref = selected.popleft()
                    if _visit_key(ref) in busy:
                        continue
                    busy.add(_visit_key(ref))
                    visiting[managers.submit(self._visit_and_dispatch, ref)] = _visit_key(ref)
                    submitted += 1
            if not visiting:
                self._stopping.wait(cfg.idle_sleep_s)
            elif free <= 0 or not selected:
                # Managers all busy, or every selected pointer handed out: go on when a
                # manager frees up (or after the idle sleep), not at once.
                futures.wait(visiting, cfg.idle_sleep_s, futures.FIRST_COMPLETED)

    def _visit_and_dispatch(self, ref: PointerRef) -> int:
        assert self._workers is not None
        try:
            works = self.visit(ref)
        except Exception:
            log.exception("manager visit failed")
            return 0
        for work in works:
            self._workers.post(self._execute_logged, work)
        return len(works)

    def _execute_logged(self, work: Work) -> None:
        try:
            self.execute(work)
        except HandlerInterrupted:
            pass  # raised after the handler returned; the lease expires on its own
        except Exception:
            log.exception("worker failed on item %s", work.item.item_id)

    def _extender_loop(self) -> None:
        period = min(1.0, (self.config.lease_extend_s or self.config.item_lease_s / 3) / 2)
        while not self._stopping.wait(period):
            try:
                self.extend_leases_once()
                self.refresh_slots_once()
            except Exception:
                log.exception("lease extender failed")

    def _flusher_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                first = self._completions.get(timeout=0.05)
            except queue.Empty:
                continue
            self._completions.put(first)
            try:
                self.flush_completions()
            except Exception:
                log.exception("completion flush failed")

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def stop(self, deadline_s: float | None = None) -> None:
        """Stop taking work; let running handlers finish until the deadline, give back
        the leases of everything not finished, flush completions."""
        deadline = time.monotonic() + (
            self.config.shutdown_deadline_s if deadline_s is None else deadline_s
        )
        self._stopping.set()
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        if self._managers is not None:
            self._managers.shutdown(deadline)
        while self.in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
            self.flush_completions()
        with self._lock:
            running = list(self._running.values())
        for r in running:
            interrupt_thread(r.thread_id, ShutdownInterrupted)
        if self._workers is not None and not self._workers.shutdown(time.monotonic() + 1.0):
            # Handlers stuck in blocking calls ignore the interrupt: give their leases
            # back so another consumer takes the items at once, and leave the threads.
            with self._lock:
                stuck = list(self._running.values())
            for r in stuck:
                self._give_back(r.work)
        self.flush_completions()
        self.scanner_election.release_all()
        self._threads.clear()
        self._managers = self._workers = None

    def run_forever(self, *, install_signals: bool = True) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully."""
        stop = threading.Event()
        if install_signals:

            def on_signal(signum: int, frame: FrameType | None) -> None:
                log.info("signal %d: shutting down", signum)
                stop.set()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        self.start()
        try:
            while not stop.wait(0.2):
                pass
        finally:
            self.stop()

    def request_stop(self) -> None:
        self._stopping.set()


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text[:500]


def _visit_key(ref: PointerRef) -> tuple[str, int, str]:
    return ref.cluster, ref.shard, ref.pointer_id

"""The Consumer: wires the scanner (paper Algorithm 1), the managers (Algorithm 2), the
workers (Algorithm 3), the completer and the lease extender, and starts them. Each step is
a plain method (``scan_once``, ``visit``, ``execute``) a test or the simulator can drive
in one thread; ``start`` runs them on threads."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from quickzones.clock import Clock, SystemClock
from quickzones.consumer.completer import BatchedCompleter, Completer, InlineCompleter
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.election import Election, new_candidate_id
from quickzones.consumer.events import Events, Observer
from quickzones.consumer.failure import Failures
from quickzones.consumer.interrupt import HandlerInterrupted, ShutdownInterrupted
from quickzones.consumer.item_ops import StoreItemOps
from quickzones.consumer.lease_extender import LeaseExtender
from quickzones.consumer.maintenance import HEARTBEAT_S, Heartbeats, OutcomeCollector
from quickzones.consumer.manager import Manager
from quickzones.consumer.pool import DaemonPool
from quickzones.consumer.routing import Router
from quickzones.consumer.scanner import Scanner
from quickzones.consumer.scanner_election import ScannerElection, route_of
from quickzones.consumer.single_thread import drain_until_idle
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster, InFlight, Work
from quickzones.consumer.stop_request import RunsForever, StopRequest
from quickzones.consumer.store_watch import StoreWatch
from quickzones.consumer.timers import DueTimers
from quickzones.consumer.weighing import Weighing
from quickzones.consumer.worker import Worker
from quickzones.errors import ConfigurationError, StoreLost
from quickzones.registry import Registry
from quickzones.store.changes import watchers_for
from quickzones.store.kv import KVStore
from quickzones.store.limits import Limits
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.toplevel import PointerRef, TopLevelQueue
from quickzones.store.zonestore import ZoneStore

log = logging.getLogger("quick.consumer")


class Consumer(RunsForever):
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
        heartbeat_s: float = HEARTBEAT_S,  # for tests: dashboards that follow sooner
    ) -> None:
        self.zones = zones
        self.toplevel = toplevel
        self.name = name or new_candidate_id()  # its pointer leases record it (explain's)
        self.clusters = {toplevel.cluster: Cluster(zones, toplevel, kv, holder=self.name)}
        for extra in more_clusters:
            if extra.name in self.clusters:
                raise ConfigurationError(f"cluster {extra.name!r} given twice")
            self.clusters[extra.name] = dataclasses.replace(extra, holder=self.name)
        self.registry = registry
        self.kv = kv
        self.config = cfg = config or ConsumerConfig()
        self.config.validate()
        self.clock = clock = clock or SystemClock()
        self.limits = limits
        self.rng = random.Random(self.config.seed)
        self.events = Events(observer)
        self.stats = self.events.stats
        emit = self._emit
        self._flight = flight = InFlight(cfg.held_bound(), self._room_freed, workers=cfg.workers)
        self._lock = flight.lock
        self._slots = Slots(limits, self.name, cfg.item_lease_s, flight.lock, emit)
        self.router = router = Router(cfg, registry, clock, emit)
        router.check()
        self.election = election  # Redis or memcached, in front of the store's own
        # A routed consumer stands in the election of the consumers routed alike, never
        # in the cluster's: holding that one, it would leave the pointers it does not
        # take without an in-order scanner (invariant 10).
        route = route_of(cfg.apps, cfg.job_types)
        self.scanner_election = ScannerElection.in_stores(
            self.clusters, self.name, clock, election, cfg.in_order, cfg.election_ttl_s, emit,
            route=route,
        )
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()  # one shutdown at a time (stop() is idempotent)
        self._run_request: StopRequest | None = None  # while run_forever runs
        self.lost: StoreLost | None = None  # the store this consumer uses went away
        self._lost_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._managers: DaemonPool | None = None
        self._workers: DaemonPool | None = None
        self._batching = False  # run_until_idle completes a visit's items in one batch
        clusters = self.clusters
        # The threaded runtime's timer lookahead, where every cluster's zones allow it.
        lookahead = all(c.zones.capabilities.lookahead_dequeue for c in clusters.values())
        self.timers = DueTimers(clock)
        self.scanner = Scanner(
            cfg,
            clusters,
            self.rng,
            in_order_for=self.in_order_for,
            refresh_election=self.refresh_election,
            capacity=self.capacity,
            emit=emit,
            skip=router.skips,
            clock=clock,
            lookahead_ms=int(cfg.timer_lookahead_s * 1000) if lookahead else 0,
            held=lambda ref: flight.of_pointer(ref.cluster, ref.shard, ref.pointer_id),
            weighing=(weighing := Weighing(emit)),
            watchers=() if cfg.commit_poll_s is None else watchers_for(
                c.toplevel.kv for c in clusters.values()
            ),
            on_lost=self._store_lost,
        )
        self.manager = Manager(
            cfg,
            clusters,
            registry,
            clock,
            flight,
            self._slots,
            limits,
            emit=emit,
            # Looked up late (a test hook); routing first, then the manager's caps.
            accept=lambda reserved: router.accept(self._accept(reserved)),
            share=lambda: self.scanner.share,
            weighing=weighing,
            wake_scanner=lambda: self.scanner.wake(),
            requeued=lambda key, vests_ms: self.scanner.requeued.told(key, vests_ms),
        )
        self._accept: Callable[[dict[str, str]], Callable[[WorkItem], bool]]
        self._accept = self.manager.accept
        if router.apps is not None:
            self.manager.accept_pointer = router.takes_pointer
        self.failures = Failures(clusters, clock, self.rng, emit, lambda: self.scanner.wake())
        self.inline_completer = InlineCompleter(clusters, emit)
        self.batched_completer = BatchedCompleter(clusters, emit)
        self.item_ops = ops = StoreItemOps(clusters, self.failures, self._completer)
        self.worker = Worker(
            cfg,
            clusters,
            registry,
            clock,
            flight,
            self._slots,
            limits,
            ops,
            emit=emit,
            shutting_down=lambda: self._stopping.is_set() and self._workers is not None,
            stopping=self._stopping,
            router=router,
            paused=self.manager.paused,  # the visits' cached pauses
        )
        self.lease_extender = LeaseExtender(cfg, ops, clock, flight, self._slots, emit)
        kvs = [(c.kv, c.toplevel.keys, c.zones) for c in clusters.values() if c.kv is not None]
        gc_s = cfg.outcome_gc_interval_s
        self.outcome_collector = OutcomeCollector(lambda: kvs, clock, gc_s, self.rng)
        stores = [(c.name, c.kv, c.toplevel.keys) for c in clusters.values() if c.kv is not None]
        busy = lambda: (len(flight.running), flight.total())  # noqa: E731
        beats = (lambda: stores, self.name, cfg, busy, self.in_order_for, clock, heartbeat_s)
        self.heartbeats = Heartbeats(*beats, running=flight.running_items)
        self.store_watch = StoreWatch(clusters)  # says at once when a store stops answering

    # --- observation -------------------------------------------------------------------

    @property
    def observer(self) -> Observer | None:
        return self.events.observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self.events.observer = observer

    def _emit(self, event: str, **fields: Any) -> None:
        self.heartbeats.count(event, fields)  # pickups, run times and failures
        self.events.emit(event, **fields)

    # --- election ----------------------------------------------------------------------

    @property
    def in_order(self) -> bool:
        """Whether this consumer is the in-order scanner of its first cluster."""
        return self.in_order_for(self.toplevel.cluster)

    def in_order_for(self, cluster: str) -> bool:  # holds that cluster's scanner lease
        return self.scanner_election.holds(cluster)

    def refresh_election(self) -> None:
        """Acquire or renew the in-order scanner lease of each cluster's top-level queue."""
        self.scanner_election.refresh(list(self.clusters))

    # --- the three algorithms, one step at a time ----------------------------------------

    def capacity(self) -> int:
        """How many more items this consumer may take now (``processing_bound``)."""
        return self._flight.capacity()

    def in_flight(self) -> int:  # items held: waiting for a worker or running
        return self._flight.total()

    def scan_once(self) -> list[PointerRef]:
        """Algorithm 1: choose the pointers to visit (see :class:`Scanner`)."""
        return self.scanner.scan_once()

    def visit(self, ref: PointerRef) -> list[Work]:
        """Algorithm 2: one zone visit (see :class:`Manager`)."""
        return self.manager.visit(ref)

    def visit_many(self, refs: Sequence[PointerRef]) -> list[Work]:
        """Algorithm 2 for several zones (``visits_per_transaction`` per transaction)."""
        return self.manager.visit_many(refs)

    def execute(self, work: Work) -> str:
        """Algorithm 3: run one leased item; returns its outcome (see :class:`Worker`)."""
        return self.worker.execute(work)

    def _completer(self) -> Completer:
        if self._workers is not None or self._batching:
            return self.batched_completer
        return self.inline_completer

    def flush_completions(self) -> int:
        """Complete every finished item, batched per zone in one transaction each."""
        return self.batched_completer.flush()

    def extend_leases_once(self) -> None:  # held items' leases near expiry (LeaseExtender)
        self.lease_extender.extend_once()

    def refresh_slots_once(self) -> None:
        """Keep this consumer's pool-wide concurrency slots from lapsing."""
        self._slots.refresh_once()

    # --- single-threaded driving ---------------------------------------------------------

    def run_until_idle(self, *, max_rounds: int = 10_000) -> int:
        """Scan, visit and execute in this thread until no vested pointer is left, or two
        rounds in a row visit the same pointers and take nothing (what is left is not this
        consumer's to take now: other job types, a cap held elsewhere); returns the count
        of items run. A zone whose visit fails on its own is set aside and the others
        run; a round whose zones gave nothing and failed raises. For tests, the simulator."""
        return drain_until_idle(self, max_rounds)

    # --- threaded runtime ----------------------------------------------------------------

    def start(self) -> None:
        """Start the scanner, extender, flusher, collector threads and the pools."""
        self._stopping.clear()
        self._managers = managers = DaemonPool(self.config.managers, "quick-mgr")
        self._workers = DaemonPool(self.config.workers, "quick-wrk")
        stopping = self._stopping
        for target, name in (
            (lambda: self.scanner.run(managers, self._visit_and_dispatch, stopping), "scanner"),
            (lambda: self.timers.run(lambda w: self._post([w]), stopping), "timers"),
            (lambda: self.lease_extender.run(stopping), "extender"),
            (
                lambda: self.batched_completer.run(stopping, self.config.completion_flush_s),
                "flusher",
            ),
            (lambda: self.outcome_collector.run(stopping), "outcome-gc"),
            (lambda: self.heartbeats.run(stopping), "heartbeat"),
            (lambda: self.store_watch.run(stopping), "store-watch"),
        ):
            t = threading.Thread(target=target, name=f"quick-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _post(self, works: list[Work]) -> None:
        """Queue ``works`` for the workers, each zone's in one post to its lane (fair)."""
        lanes: dict[tuple[str, ZoneId], list[tuple[Work]]] = {}
        for work in works:
            lanes.setdefault((work.cluster, work.zone), []).append((work,))
        for lane, args in lanes.items():
            if (workers := self._workers) is None:  # stopped meanwhile: give them back
                for (work,) in args:
                    self._execute_logged(work)
                continue
            weight = self.manager.weighing.of_zone(lane[1])  # 1 while no weight is stored
            workers.post_many(self._execute_logged, args, lane=lane, weight=weight)

    def _visit_and_dispatch(self, refs: list[PointerRef]) -> int:
        def hand_out(works: list[Work]) -> None:
            self._flight.mark_direct(works)
            for work in (w for w in works if w.due_ms is not None):
                self.timers.add(work)  # leased ahead: started at its vesting time
            self._post([work for work in works if work.due_ms is None])

        # Room claimed first: concurrent visits take no more than workers can start. A
        # visit that raises is counted, logged and backed off by the scanner.
        with self._flight.claim(self.manager.claim_size(refs)) as room:
            ahead = self.scanner.lookahead_ms
            return len(self.manager.visit_many(refs, hand_out, horizon_ms=ahead)) if room else 0

    def _execute_logged(self, work: Work) -> None:
        try:
            self.execute(work)
        except HandlerInterrupted:
            pass  # raised after the handler returned; the lease expires on its own
        except BaseException:  # a worker thread must survive anything
            log.exception("worker failed on item %s", work.item.item_id)

    def _stop(self, deadline_s: float | None) -> None:
        """Stop taking work; let running handlers finish until the deadline, give back
        the leases of everything not finished, flush completions (see :meth:`stop`)."""
        deadline = time.monotonic() + (
            self.config.shutdown_deadline_s if deadline_s is None else deadline_s
        )
        self._stopping.set()
        for wake in (self.scanner.wake, self.timers.wake, self.batched_completer.wake):
            wake()
        for t in self._threads:
            t.join(timeout=max(0.1, deadline - time.monotonic()))
        if self._managers is not None:
            self._managers.shutdown(deadline)
        # Items leased ahead and not yet due go back as they were, due at the same time.
        for work in self.timers.drain():
            self._execute_logged(work)
        if self._workers is not None:
            # Items waiting for a worker are given back now, not after the handlers that
            # hold every worker end (or, if they never do, when their leases expire).
            for _, args in self._workers.drain():
                self._execute_logged(*args)
        while self.in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
            self.flush_completions()
        for r in self._flight.snapshot():
            self._flight.interrupt(r, ShutdownInterrupted)
        if self._workers is not None and not self._workers.shutdown(time.monotonic() + 1.0):
            # Handlers stuck in blocking calls ignore the interrupt: give their leases
            # back so another consumer takes the items at once, and leave the threads.
            for r in self._flight.snapshot():
                self.failures.give_back(r.work)
        self.flush_completions()
        self.scanner_election.release_all()
        self.heartbeats.forget()
        self._threads.clear()
        self._managers = self._workers = None

    def _stopping_requested(self) -> None:  # request_stop(): take no more work
        self._stopping.set()
        self.scanner.wake()

    def _room_freed(self) -> None:
        self.scanner.room_freed()

    def item_cancelled(self, zone: ZoneId, item_id: str) -> None:
        """Cancelled through this process's Quick: held here, it never starts."""
        self._flight.cancel_held(zone, item_id)

    def wake(self) -> None:
        """Scan now instead of at the next poll: work was just enqueued in this process
        (:class:`~quickzones.client.Quick` calls it after each of its enqueues)."""
        self.scanner.wake()

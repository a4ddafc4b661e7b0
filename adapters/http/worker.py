"""A worker on another machine: runs a registry's handlers on items it leases through
``quick serve``'s pull API (``quick worker --remote URL``).

The server does the scanning and zone leasing (:mod:`quickzones.consumer.pull_leaser`); this
loop leases only as many items as it has free workers and runs each through the
consumer's one Worker (paper Algorithm 3, :class:`~quickzones.consumer.worker.Worker`),
its lease kept by the consumer's lease extender. What the Worker does to an item goes
over HTTP (:class:`RemoteItemOps`, the :class:`~quickzones.consumer.item_ops.ItemOps`
seam; the HTTP form of the consumer's settler, :mod:`quickzones.consumer.settler`,
whose retry decision it takes): the start check (an extension: a cancelled or taken-over
item never starts), extensions, a running item's cancel (one request for all running
items, every half second: ``ctx.cancelled``), completion (batched, see
:class:`RemoteWorker`), a retry with backoff or a nack (``nack``), a dead letter
(``fail``). Transactional handlers need the store itself and are not leased.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from quickzones.adapters.http.client import (
    COMPLETE_BATCH_MAX,
    ItemGone,
    RemoteError,
    RemoteLease,
    RemoteQuick,
)
from quickzones.clock import SystemClock
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.lease_extender import LeaseExtender
from quickzones.consumer.pickups import waited_ms
from quickzones.consumer.routing import Router
from quickzones.consumer.settler import retry_decision
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import InFlight, Work
from quickzones.consumer.worker import Worker
from quickzones.errors import ItemNotFound, LeaseLost, Nack, QuickError, StorageError
from quickzones.registry import JobType, Registry
from quickzones.repeated_failure import RepeatedFailure, backoff
from quickzones.store.records import WorkItem, ZoneId

log = logging.getLogger("quick.remote_worker")

# What a failed request raises: the API's answer, or the connection.
_REQUEST_ERRORS = (RemoteError, httpx.HTTPError, OSError)


@dataclass(slots=True)
class RemoteWorkerStats:
    completed: int = 0
    nacked: int = 0
    retried: int = 0
    failed: int = 0
    lease_lost: int = 0
    errors: int = 0
    pickup_ms: list[int] = field(default_factory=list)


def _item_of(lease: RemoteLease) -> WorkItem:
    if isinstance(lease.payload, bytes):
        body, content_type = lease.payload, "bytes"
    else:
        body, content_type = json.dumps(lease.payload).encode(), "json"
    return WorkItem(
        item_id=lease.item_id,
        job_type=lease.job_type,
        payload=body,
        priority=lease.priority,
        vesting_ms=lease.lease_expires_ms,
        enqueued_ms=lease.enqueued_ms,
        error_count=lease.error_count,
        lease_id=lease.lease_id,
        last_error=lease.last_error,
        content_type=content_type,
        attempts=lease.attempts,
        meta=dict(lease.meta),
    )


class RemoteItemOps:
    """:class:`~quickzones.consumer.item_ops.ItemOps` over the pull API: the Worker's
    operations on an item it leased through ``quick serve``."""

    def __init__(self, client: RemoteQuick, stats: RemoteWorkerStats, lease_s: float) -> None:
        self.client = client
        self.stats = stats
        self.lease_s = lease_s
        self.rng = random.Random()
        # To complete: each lease with its handler's return value (kept if its type asks).
        self.done: queue.Queue[tuple[RemoteLease, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._leases: dict[int, RemoteLease] = {}  # by id(work): one per run

    def hold(self, lease: RemoteLease) -> Work:
        """The Work a Worker runs for ``lease``."""
        work = Work(ZoneId(lease.app, lease.tenant), _item_of(lease), time.monotonic())
        with self._lock:
            self._leases[id(work)] = lease
        return work

    def lease_of(self, work: Work) -> RemoteLease:
        with self._lock:
            return self._leases[id(work)]

    def forget(self, work: Work) -> None:
        """The run is over (its outcome reported, or its success queued to complete)."""
        with self._lock:
            self._leases.pop(id(work), None)

    def start(self, work: Work) -> WorkItem:
        # Only an item that waited (this worker asks for what its free workers start at
        # once, so rarely): the check is an extension, which fails for an item cancelled
        # or taken over since.
        return self.extend(work, int(self.lease_s * 1000))

    def take_at_most_once(self, work: Work) -> Exception | None:
        raise StorageError("at-most-once items are not leased to remote workers")

    def extend(self, work: Work, lease_ms: int) -> WorkItem:
        try:
            until = self.client.extend(self.lease_of(work), lease_ms / 1000)
        except ItemGone as err:  # cancelled (or finished elsewhere): as the store says it
            raise ItemNotFound(work.item.item_id) from err
        except _REQUEST_ERRORS as err:
            raise StorageError(f"extending over HTTP failed: {err}") from err
        return work.item.with_(vesting_ms=until)

    def gone_many(self, works: Sequence[Work]) -> list[bool]:
        with self._lock:  # a run that ended meanwhile is not asked about
            leases = [self._leases.get(id(work)) for work in works]
        held = [lease for lease in leases if lease is not None]
        if not held:
            return [False] * len(works)
        try:  # one request for all running items (POST /v1/leases/cancelled)
            answers = iter(self.client.cancelled(held))
        except (QuickError, *_REQUEST_ERRORS) as err:
            raise StorageError(f"asking for cancels over HTTP failed: {err}") from err
        return [lease is not None and next(answers) for lease in leases]

    def complete(self, work: Work) -> None:
        self.done.put((self.lease_of(work), work.result))

    def finish_taken(self, work: Work) -> None:
        raise StorageError("at-most-once items are not leased to remote workers")

    def fail(
        self,
        work: Work,
        job: JobType | None,
        reason: str,
        *,
        permanent: bool,
        failure: str | None = None,
    ) -> str:
        lease = self.lease_of(work)
        # The consumer's one retry decision (quickzones.consumer.settler), sent over HTTP.
        delay = retry_decision(
            job, lease.error_count, lease.enqueued_ms, time.time(), self.rng, permanent=permanent
        )
        if delay is None:
            outcome = self._report(lambda: self.client.fail(lease, reason, failure))
            if outcome is None:
                self.stats.failed += 1
            return outcome or "dead_lettered"
        meta = work.retry_meta or None  # what the next run sees, as a local requeue keeps it
        outcome = self._report(
            lambda: self.client.nack(lease, delay_s=delay, error=reason, meta=meta)
        )
        if outcome is None:
            self.stats.retried += 1
        return outcome or "requeued"

    def nack(self, work: Work, nack: Nack) -> str:
        lease = self.lease_of(work)
        delay, meta = max(0.0, nack.delay_s), nack.meta or None
        outcome = self._report(lambda: self.client.nack(lease, delay_s=delay, meta=meta))
        if outcome is None:
            self.stats.nacked += 1
        return outcome or "nacked"

    def progress(self, work: Work, fraction: float, note: str | None, tr: Any = None) -> None:
        try:
            self.client.progress(self.lease_of(work), fraction, note)
        except _REQUEST_ERRORS as err:
            raise StorageError(f"reporting progress over HTTP failed: {err}") from err

    def give_back(self, work: Work, delay_ms: int = 0) -> str:
        lease = self.lease_of(work)
        return (
            self._report(lambda: self.client.nack(lease, delay_s=delay_ms / 1000, ran=False))
            or "released"
        )

    def _report(self, call: Any) -> str | None:
        """Send an outcome; None when it was taken, else why not."""
        try:
            call()
        except (LeaseLost, ItemNotFound):
            self.stats.lease_lost += 1
            return "lease_lost"
        except (QuickError, *_REQUEST_ERRORS) as err:
            self.stats.errors += 1  # the lease lapses and the item runs again
            log.warning("reporting an outcome failed: %s", err)
            return "lease_lost"
        return None


class RemoteWorker:
    """Pulls and runs items of the registry's job types until stopped.

    A handler's slot is free again as soon as it returns: successful items are completed
    by a completer thread, together (``POST /v1/completions``, one commit per zone on the
    server), while the next items are leased and run."""

    def __init__(
        self,
        registry: Registry,
        client: RemoteQuick,
        *,
        workers: int = 8,
        lease_s: float = 30.0,
        wait_s: float = 5.0,
        app: str | None = None,
        fill_s: float | None = 0.005,
        complete_linger_s: float = 0.01,
    ) -> None:
        self.registry = registry
        self.client = client
        self.workers = workers
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.app = app
        # Leases hand out what they hold fill_s after their scan began (see the API's
        # fill_s): a handler starts sooner; free slots are leased again at once anyway.
        self.fill_s = fill_s
        self.complete_linger_s = complete_linger_s
        self.job_types = [
            name
            for name in registry.names()
            if not registry.find(name).transactional  # type: ignore[union-attr]
        ]
        # Each handler's pool-wide cap, sent with every lease: the server holds the
        # type's slot for each item it leases (the consumer's fetcher).
        self.pool_caps = {
            name: cap
            for name in self.job_types
            if (cap := registry.find(name).pool_max_concurrency) is not None  # type: ignore[union-attr]
        }
        # And each one's named limits and cost: the server takes their slots for each
        # item it leases, with the gate a local worker's handler starts behind.
        self.named_limits = {
            name: {"limits": list(job.limits), "cost": job.cost}
            for name in self.job_types
            if (job := registry.find(name)) is not None and job.limits
        }
        self.stats = RemoteWorkerStats()
        # The server restarting or gone: said once, then once per interval with a count,
        # and once when it answers again; leases retried with a capped backoff.
        server = client.url
        self.lease_failures = RepeatedFailure(
            log,
            "leasing",
            level=logging.WARNING,
            failing=f"quick serve at {server} is unreachable",
            recovered=f"quick serve at {server} is reachable again",
        )
        self._stop = threading.Event()
        self._slot_freed = threading.Condition()
        self.ops = RemoteItemOps(client, self.stats, lease_s)
        # The consumer's Worker (Algorithm 3) and lease extender, over HTTP.
        config = ConsumerConfig(workers=workers, item_lease_s=lease_s)
        clock = SystemClock()
        self.in_flight = InFlight(workers, freed=self._notify_free, workers=workers)
        slots = Slots(None, "remote", lease_s, self.in_flight.lock, self._emit)
        self.worker = Worker(
            config,
            {},
            registry,
            clock,
            self.in_flight,
            slots,
            None,
            self.ops,
            emit=self._emit,
            shutting_down=lambda: False,
            stopping=self._stop,
            router=Router(config, registry, clock, self._emit),
        )
        self.extender = LeaseExtender(config, self.ops, clock, self.in_flight, slots, self._emit)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="quick-remote")

    def _emit(self, event: str, **fields: Any) -> None:
        if event in ("lease_lost", "cancelled"):
            self.stats.lease_lost += 1

    def _notify_free(self) -> None:
        with self._slot_freed:
            self._slot_freed.notify_all()

    def request_stop(self) -> None:
        self._stop.set()
        self._notify_free()

    def _free(self) -> int:
        return self.in_flight.capacity()

    def _wait_for_slot(self) -> None:
        with self._slot_freed:
            if self._free() <= 0 and not self._stop.is_set():
                self._slot_freed.wait(0.1)

    def run_forever(self, *, idle_exit: bool = False) -> int:
        """Lease and run until :meth:`request_stop` (or, with ``idle_exit``, until a lease
        comes back empty and nothing runs); returns how many items ran. Items that ran
        are completed before it returns."""
        extending = threading.Event()
        extender = threading.Thread(target=self.extender.run, args=(extending,), daemon=True)
        extender.start()
        completer = threading.Thread(target=self._complete_loop, daemon=True)
        completer.start()
        ran = 0
        pending: list[Future[None]] = []
        try:
            while not self._stop.is_set():
                pending = [f for f in pending if not f.done()]
                free = self._free()
                if free <= 0:
                    self._wait_for_slot()
                    continue
                try:
                    leases = self.client.lease(
                        free,
                        wait_s=0 if idle_exit else self.wait_s,
                        lease_s=self.lease_s,
                        app=self.app,
                        job_types=self.job_types,
                        fill_s=self.fill_s,
                        pool_caps=self.pool_caps or None,
                        named_limits=self.named_limits or None,
                    )
                    self.lease_failures.succeeded()
                except (QuickError, *_REQUEST_ERRORS) as err:
                    self.stats.errors += 1
                    failures = self.lease_failures.failed(err)
                    self._stop.wait(backoff(failures))
                    continue
                if not leases:
                    if idle_exit and not pending:
                        break
                    continue
                now = int(time.time() * 1000)
                works = []
                for lease in leases:
                    if lease.attempts <= 1:
                        waited = waited_ms(lease.enqueued_ms, now, lease.vested_ms)
                        self.stats.pickup_ms.append(waited)
                    works.append(self.ops.hold(lease))
                self.in_flight.hold(works)
                self.in_flight.mark_direct(works)
                for work in works:
                    pending.append(self._pool.submit(self._run, work))
                    ran += 1
        finally:
            for f in pending:
                f.result()
            self.ops.done.put(None)  # complete what is queued, then stop
            completer.join()
            self._stop.set()
            extending.set()
            extender.join(timeout=5)
        return ran

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _run(self, work: Work) -> None:
        try:
            self.worker.execute(work)  # Algorithm 3; its outcome went out through self.ops
        except BaseException:  # a worker thread survives anything; the lease lapses
            self.stats.errors += 1
            log.exception("remote worker failed on item %s", work.item.item_id)
        finally:
            self.ops.forget(work)

    def _complete_loop(self) -> None:
        """Completes the items whose handler succeeded: those finishing within
        ``complete_linger_s`` of the first, in one request; one request at a time, so
        items finishing meanwhile make the next batch. (A completion waiting a few ms
        delays no handler: only the server's work per item goes down.)"""
        stopping = False
        while not stopping:
            first = self.ops.done.get()
            batch: list[tuple[RemoteLease, Any]] = []
            if first is None:
                stopping = True
            else:
                batch.append(first)
            until = time.monotonic() + self.complete_linger_s
            while not stopping and len(batch) < COMPLETE_BATCH_MAX:
                try:
                    more = self.ops.done.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                else:
                    batch.append(more)
            if batch:
                self._complete(batch)

    def _complete(self, done: list[tuple[RemoteLease, Any]]) -> None:
        batch = [lease for lease, _ in done]
        results = [result for _, result in done]
        try:
            outcomes = self.client.complete_many(batch, results)
        except (QuickError, *_REQUEST_ERRORS) as err:
            self.stats.errors += len(batch)  # the leases lapse and the items run again
            log.warning("completing %d items failed: %s", len(batch), err)
            outcomes = None
        if outcomes is None:
            return
        for lease, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                self.stats.completed += 1
            elif isinstance(outcome, LeaseLost):
                self.stats.lease_lost += 1
            else:
                self.stats.errors += 1
                log.warning("completing %s failed: %s", lease.item_id, outcome)


def run_remote(q: object, url: str, token: str | None, *, workers: int, lease_s: float) -> None:
    """``quick worker --remote URL``: run ``q``'s handlers on items pulled from ``url``
    until SIGTERM/SIGINT, letting running handlers finish."""
    import signal

    from quickzones.errors import ConfigurationError

    registry = getattr(q, "registry", None)
    if not isinstance(registry, Registry):
        raise ConfigurationError("the app module's object has no handler registry")
    if not token:
        raise ConfigurationError("--remote needs --token (or QUICK_TOKEN) with the consume role")
    with RemoteQuick(url, token) as client:
        worker = RemoteWorker(registry, client, workers=workers, lease_s=lease_s)

        def on_signal(signum: int, frame: object) -> None:
            worker.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print(f"quick worker --remote {url}: job types {', '.join(worker.job_types)}", flush=True)
        try:
            worker.run_forever()
        finally:
            worker.close()

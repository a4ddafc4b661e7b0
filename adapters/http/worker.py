"""A worker on another machine: runs a registry's handlers on items it leases through
``quick serve``'s pull API (``quick worker --remote URL``).

The server does the scanning and zone leasing (:mod:`quickzones.adapters.http.pull`); this loop
only leases up to its free slots, runs handlers on a thread pool, keeps their leases
extended, and reports each outcome with the lease id: complete (batched, see
:class:`RemoteWorker`), nack (a :class:`Nack`, or a failure its retry policy retries, with
backoff), or fail (a :class:`PermanentError`, or the policy gives up). Transactional
handlers need the store itself and are not leased.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from quickzones.adapters.http.client import COMPLETE_BATCH_MAX, RemoteLease, RemoteQuick, backoff
from quickzones.consumer.failure_log import format_failure
from quickzones.errors import LeaseLost, Nack, PermanentError, QuickError
from quickzones.registry import JobContext, Registry
from quickzones.store.records import WorkItem, ZoneId

log = logging.getLogger("quick.remote_worker")


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
    )


class RemoteWorker:
    """Pulls and runs items of the registry's job types until stopped.

    A handler's slot is free again as soon as it returns: successful items are completed
    by a completer thread, together (``POST /v1/completions``, one commit per zone on the
    server), while the next items are leased and run; their leases are kept extended
    until the completion is in."""

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
        self.stats = RemoteWorkerStats()
        self.rng = random.Random()
        self._stop = threading.Event()
        self._lock = threading.Condition()  # also signals a handler slot freed
        self._running: dict[str, RemoteLease] = {}  # leases held: running or completing
        self._busy = 0  # handlers running
        self._done: queue.Queue[RemoteLease | None] = queue.Queue()  # to complete
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="quick-remote")

    def request_stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def _free(self) -> int:
        with self._lock:
            return self.workers - self._busy

    def _wait_for_slot(self) -> None:
        with self._lock:
            if self._busy >= self.workers and not self._stop.is_set():
                self._lock.wait(0.1)

    def run_forever(self, *, idle_exit: bool = False) -> int:
        """Lease and run until :meth:`request_stop` (or, with ``idle_exit``, until a lease
        comes back empty and nothing runs); returns how many items ran. Items that ran
        are completed before it returns."""
        extender = threading.Thread(target=self._extend_loop, daemon=True)
        extender.start()
        completer = threading.Thread(target=self._complete_loop, daemon=True)
        completer.start()
        ran = 0
        failures = 0
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
                    )
                    failures = 0
                except (QuickError, OSError) as err:
                    self.stats.errors += 1
                    log.warning("lease failed: %s", err)
                    failures += 1
                    time.sleep(backoff(failures))
                    continue
                if not leases:
                    if idle_exit and not pending:
                        break
                    continue
                now = int(time.time() * 1000)
                for lease in leases:
                    if lease.attempts <= 1:
                        self.stats.pickup_ms.append(max(0, now - lease.enqueued_ms))
                    with self._lock:
                        self._running[lease.item_id] = lease
                        self._busy += 1
                    pending.append(self._pool.submit(self._run, lease))
                    ran += 1
        finally:
            for f in pending:
                f.result()
            self._done.put(None)  # complete what is queued, then stop
            completer.join()
            self._stop.set()
            extender.join(timeout=5)
        return ran

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _run(self, lease: RemoteLease) -> None:
        completing = False
        try:
            completing = self._execute(lease)
        except LeaseLost:
            self.stats.lease_lost += 1
        except (QuickError, OSError) as err:
            self.stats.errors += 1  # the lease lapses and the item runs again
            log.warning("reporting %s failed: %s", lease.item_id, err)
        finally:
            with self._lock:
                if not completing:
                    self._running.pop(lease.item_id, None)
                self._busy -= 1
                self._lock.notify_all()
            if completing:
                self._done.put(lease)

    def _execute(self, lease: RemoteLease) -> bool:
        """Run the handler and report a failure; True when the item is to be completed."""
        job = self.registry.find(lease.job_type)
        if job is None:
            self.client.nack(lease, delay_s=60, error=f"no handler for {lease.job_type!r}")
            self.stats.nacked += 1
            return False
        ctx = JobContext(ZoneId(lease.app, lease.tenant), _item_of(lease))
        try:
            job.call(ctx)
        except Nack as nack:
            self.client.nack(lease, delay_s=max(0.0, nack.delay_s))
            self.stats.nacked += 1
            return False
        except PermanentError as err:
            self.client.fail(lease, f"{type(err).__name__}: {err}", format_failure(err))
            self.stats.failed += 1
            return False
        except Exception as err:
            reason = f"{type(err).__name__}: {err}"
            errors = lease.error_count + 1
            age_s = time.time() - lease.enqueued_ms / 1000
            if job.retry.gives_up(errors, age_s):
                self.client.fail(lease, reason, format_failure(err))
                self.stats.failed += 1
            else:
                delay = job.retry.backoff_s(errors, self.rng)
                self.client.nack(lease, delay_s=delay, error=reason)
                self.stats.retried += 1
            return False
        return True

    def _complete_loop(self) -> None:
        """Completes the items whose handler succeeded: those finishing within
        ``complete_linger_s`` of the first, in one request; one request at a time, so
        items finishing meanwhile make the next batch. (A completion waiting a few ms
        delays no handler: only the server's work per item goes down.)"""
        stopping = False
        while not stopping:
            first = self._done.get()
            batch: list[RemoteLease] = []
            if first is None:
                stopping = True
            else:
                batch.append(first)
            until = time.monotonic() + self.complete_linger_s
            while not stopping and len(batch) < COMPLETE_BATCH_MAX:
                try:
                    more = self._done.get(timeout=max(0.0, until - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                else:
                    batch.append(more)
            if batch:
                self._complete(batch)

    def _complete(self, batch: list[RemoteLease]) -> None:
        try:
            outcomes = self.client.complete_many(batch)
        except (QuickError, OSError) as err:
            self.stats.errors += len(batch)  # the leases lapse and the items run again
            log.warning("completing %d items failed: %s", len(batch), err)
            outcomes = None
        with self._lock:
            for lease in batch:
                self._running.pop(lease.item_id, None)
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

    def _extend_loop(self) -> None:
        period = self.lease_s / 3
        while not self._stop.wait(period):
            with self._lock:
                running = list(self._running.values())
            for lease in running:
                try:
                    self.client.extend(lease, self.lease_s)
                except (QuickError, OSError):
                    pass  # finished meanwhile, or lost: its report says so


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

"""A Worker runs one leased item: paper Algorithm 3.

An item whose app, tenant or job type was paused after it was leased (a consumer holds
items ahead of its workers) is given back unstarted, no attempt counted, to run after the
resume. An item past its TTL, out of attempts or whose runs lapsed ``max_lapses`` times is
failed without running. Just before the handler starts, the item and its lease are
checked in the store (:meth:`~quickzones.store.zones.KVZoneStore.start`): a cancelled or
taken-over item never starts; an item leased to wait (held) has its run counted there. An
item that starts as it was dequeued (to an idle worker, or within ``START_CHECK_AFTER_S``)
with more than half its lease left needs neither that read nor a pause lookup: its
visit's were its checks. An at-most-once item is deleted at that moment instead. The
handler then runs under the lease extender's watch (:mod:`.lease_extender`); success goes
to the completer (:mod:`.completer`), failure to a retry with backoff or a dead letter
(:mod:`.failure`). A transactional handler's effects and its completion commit in one KV
transaction (invariant 9).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from quickzones.clock import Clock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.failure import describe
from quickzones.consumer.failure_log import FailureLog, format_failure
from quickzones.consumer.interrupt import (
    ExecutionBoundExceeded,
    HandlerInterrupted,
    LeaseInterrupted,
    ShutdownInterrupted,
)
from quickzones.consumer.item_ops import ItemOps
from quickzones.consumer.limit_gate import LimitGate, Refused
from quickzones.consumer.progress import ProgressReporter, reporter_for
from quickzones.consumer.routing import Router
from quickzones.consumer.slots import Slots
from quickzones.consumer.state import Cluster, InFlight, Running, Work
from quickzones.consumer.transactional import run_transactional
from quickzones.errors import (
    ItemNotFound,
    LeaseLost,
    Nack,
    PermanentError,
    StorageError,
)
from quickzones.registry import JobContext, JobType, Registry
from quickzones.store.limits import Limits
from quickzones.store.pauses import PauseSet
from quickzones.store.records import ZoneId
from quickzones.tracing import run_span

log = logging.getLogger("quick.consumer")

class Worker:
    """Algorithm 3 for one item at a time per calling thread (the worker pool shares it)."""

    def __init__(
        self,
        config: ConsumerConfig,
        clusters: dict[str, Cluster],
        registry: Registry,
        clock: Clock,
        in_flight: InFlight,
        slots: Slots,
        limits: Limits | None,
        ops: ItemOps,
        *,
        emit: Callable[..., Any],
        shutting_down: Callable[[], bool],
        stopping: threading.Event,
        router: Router | None = None,
        paused: Callable[[ZoneId], PauseSet | None] = lambda zone: None,
    ) -> None:
        self.config = config
        self.clusters = clusters
        self.registry = registry
        self.clock = clock
        self.in_flight = in_flight
        self.slots = slots
        self.limits = limits
        self.ops = ops  # the item's operations: over the zone store, or over HTTP
        self.emit = emit
        self.shutting_down = shutting_down  # a threaded stop: give items back unstarted
        self.stopping = stopping
        self.failure_log = FailureLog(log)
        self.router = router or Router(config, registry, clock, emit)
        # The pauses over a zone as the visits looked them up (cached: no read per item).
        self.paused = paused
        self.gate = LimitGate(slots, limits, clock, emit, stopping, config.limit_wait_s)

    def execute(self, work: Work) -> str:
        """Run one leased item; returns the outcome ("completed", "requeued",
        "dead_lettered", "lease_lost", "released", "nacked", "cancelled" (gone before it
        started), or "failed" for an at-most-once item whose handler started and did not
        complete)."""
        self.in_flight.starting(work)  # its lease is this worker's to keep from now on
        try:
            return self._execute(work)
        finally:
            self.in_flight.finished(work)
            if work.app_slot:
                self.slots.release("app", work.zone.app, 1)
            for name in work.tenant_slots:
                self.slots.ended("tenant", name)  # wakes a zone held at the cap

    def _execute(self, work: Work) -> str:
        zone, item = work.zone, work.item
        if self.shutting_down():
            return self.ops.give_back(work)
        # Its visit looked the pauses up as it leased it: while that is its start check,
        # it is its pause check too (pauses take effect within a second anyway).
        pauses = None if self._dequeue_was_check(work) else self.paused(zone)
        if pauses is not None and pauses.holds(zone, item.job_type):
            # Paused since its visit leased it: nothing new starts (issue 31 point 3).
            self.emit("throttled", zone=zone, reason="paused")
            return self.ops.give_back(work)
        job = self.router.job_for(item.job_type)
        if job is None:
            # Not this consumer's type (dequeue leaves such items alone; this one was
            # leased anyway): given back, its attempt not counted, never settled here.
            self.router.report(item, zone)
            return self.ops.give_back(work)
        fail = self.ops.fail
        if item.deadline_ms is not None and now_ms(self.clock) > item.deadline_ms:
            # It waited past its TTL in this consumer's local queue: never run late.
            return fail(work, job, "expired: not started before its TTL", permanent=True)
        if item.error_count >= job.retry.max_attempts:
            return fail(
                work,
                job,
                f"gave up after {item.error_count} attempts; last: {item.last_error}",
                permanent=True,
            )
        if item.lapses >= job.retry.max_lapses:
            # Its earlier runs crashed or stalled their consumers: running it again could
            # crash this one too.
            return fail(
                work,
                job,
                f"gave up: its lease lapsed {item.lapses} times, never released (its "
                f"consumer crashed or stalled each time)",
                permanent=True,
            )
        taken = self.gate.take(zone, job)
        if isinstance(taken, Refused):
            # Its limit is full (or not defined): back unstarted, no attempt counted.
            self.emit("throttled", zone=zone, reason=taken.reason)
            return self.ops.give_back(work, delay_ms=taken.retry_ms)
        try:
            return self._execute_typed(work, job)
        finally:
            self.gate.release(taken)

    def _execute_typed(self, work: Work, job: JobType) -> str:
        zone, item = work.zone, work.item
        self.emit("started", zone=zone, item_id=item.item_id, job_type=item.job_type)
        if job.pool_max_concurrency is not None and self.limits is not None:
            if not self.slots.acquire("type", job.name, 1, job.pool_max_concurrency):
                self.emit("throttled", zone=zone, reason="job type concurrency cap")
                return self.ops.give_back(work, delay_ms=100)
            try:
                return self._start_job(work, job)
            finally:
                self.slots.release("type", job.name, 1)
        return self._start_job(work, job)

    def _start_job(self, work: Work, job: JobType) -> str:
        """Run the job; an at-most-once item is deleted (holding its lease) first, at the
        last moment, so one never started is still stored and can be given back."""
        if work.item.delivery == "at_most_once":
            try:
                outcome = self.ops.take_at_most_once(work)
            except StorageError as err:
                # Deleted or not, unknown: not running it is what at-most-once allows;
                # what may remain is given back.
                self.emit("complete_error", zone=work.zone, error=str(err))
                return self.ops.give_back(work)
            if outcome is not None:
                self.emit("lease_lost", zone=work.zone, item_id=work.item.item_id, where="start")
                return "lease_lost"
            work.started = True
        else:
            checked = self._start_check(work)
            if checked is not None:
                return checked
        with run_span(work.item, work.zone):
            return self._run_job(work, job)

    def _run_job(self, work: Work, job: JobType) -> str:
        zone, item = work.zone, work.item
        attempt = 0
        while True:
            error: BaseException | None = None
            started = time.monotonic()
            try:
                if job.transactional:
                    run_transactional(self, work, job)
                    self._ran(work, job, started, ok=True)
                    self.emit("completed", zone=zone, item_id=item.item_id, job_type=job.name)
                    return "completed"
                work.result = self._run_handler(work, job, None)
            except LeaseInterrupted:
                self.emit("lease_lost", zone=zone, item_id=item.item_id, where="running")
                return "lease_lost"
            except ShutdownInterrupted:
                return self.ops.give_back(work)
            except ExecutionBoundExceeded:
                error = TimeoutError(f"exceeded execution bound of {job.execution_bound_s}s")
            except HandlerInterrupted as err:  # a kind added later: a failure, not a crash
                error = err
            except (LeaseLost, ItemNotFound) as err:
                self.emit("lease_lost", zone=zone, item_id=item.item_id, where=type(err).__name__)
                return "lease_lost"
            except PermanentError as err:
                self._ran(work, job, started, ok=False)
                text = self._log_failure(work, job, err)
                return self.ops.fail(work, job, describe(err), permanent=True, failure=text)
            except Nack as nack:
                self._ran(work, job, started, ok=True)
                return self.ops.nack(work, nack)
            except BaseException as err:
                # SystemExit and KeyboardInterrupt too: raised by a handler they are its
                # failure, counted toward max_attempts, not a silent endless redelivery.
                error = err
            self._ran(work, job, started, ok=error is None)
            if work.cancelled.is_set():
                # Cancelled while it ran: the item is gone; neither completed nor retried.
                self.emit("cancelled", zone=zone, item_id=item.item_id, where="running")
                return "cancelled"
            if error is None:
                if item.delivery == "at_most_once":
                    try:
                        self.ops.finish_taken(work)  # its record keeps the result
                    except StorageError as err:
                        self.emit("complete_error", zone=zone, error=str(err))
                    self.emit("completed", zone=zone, item_id=item.item_id, job_type=job.name)
                    return "completed"
                self.ops.complete(work)
                return "completed"
            text = self._log_failure(work, job, error)
            if attempt < job.retry.inline_retries and not self.stopping.is_set():
                attempt += 1
                self.emit("retried_inline", zone=zone, item_id=item.item_id, job_type=job.name)
                continue
            outcome = self.ops.fail(work, job, describe(error), permanent=False, failure=text)
            if isinstance(error, (KeyboardInterrupt, SystemExit)) and (
                threading.current_thread() is threading.main_thread()
            ):
                raise error  # run_until_idle in the main thread: Ctrl-C still stops it
            return outcome

    def _ran(self, work: Work, job: JobType, started: float, *, ok: bool) -> None:
        """Report one run of the handler that ended by itself (not one interrupted by a
        lost lease or a shutdown): its job type, how long it ran (steady time: a
        measurement, never a decision) and whether it raised."""
        seconds = time.monotonic() - started
        self.emit("ran", zone=work.zone, item_id=work.item.item_id, job_type=job.name,
                  seconds=seconds, ok=ok, cluster=work.cluster)  # fmt: skip

    def _log_failure(
        self, work: Work, job: JobType, error: BaseException, *, attempt: int | None = None
    ) -> str:
        """Log one handler failure at WARNING (rate-limited per job type); returns its
        bounded traceback."""
        text = format_failure(error)
        self.failure_log.failed(
            job.name,
            work.item.item_id,
            str(work.zone),
            max(1, work.item.attempts) if attempt is None else attempt,
            text,
        )
        return text

    def _start_check(self, work: Work) -> str | None:
        """Algorithm 3's check just before the handler starts: the item is still stored
        and its lease still ours (a cancelled or taken-over item never starts). An item
        handed to an idle worker as it was dequeued needs none: its dequeue read it.
        Returns the outcome when it must not start."""
        zone, item = work.zone, work.item
        if work.cancelled.is_set():  # cancelled through this process (Quick.cancel)
            self.emit("cancelled", zone=zone, item_id=item.item_id, where="before_start")
            return "cancelled"
        if not item.held and self._dequeue_was_check(work):
            return None
        try:
            # A held lease (leased to wait) becomes a started one here: its run counted.
            checked = self.ops.start(work)
            if item.held or checked.vesting_ms > item.vesting_ms:  # started, or renewed
                work.item = checked
        except ItemNotFound:
            self.emit("cancelled", zone=zone, item_id=item.item_id, where="before_start")
            return "cancelled"
        except LeaseLost:
            self.emit("lease_lost", zone=zone, item_id=item.item_id, where="before_start")
            return "lease_lost"
        except StorageError as err:
            # Whether it was cancelled is unknown: not started, given back.
            self.emit("start_error", zone=zone, item_id=item.item_id, error=str(err))
            return self.ops.give_back(work)
        return None

    def _dequeue_was_check(self, work: Work) -> bool:
        """Whether its dequeue still counts as its start check: handed to an idle worker
        (``direct``) or starting within ``START_CHECK_AFTER_S`` of it (``fresh_until``),
        and its lease still has more than half its length left on this consumer's clock.
        A lease that ran low may have lapsed on another consumer's clock and been granted
        again: such an item is always read (never start one another consumer may hold)."""
        if not work.direct and (work.fresh_until is None or time.monotonic() >= work.fresh_until):
            return False
        left_ms = work.item.vesting_ms - now_ms(self.clock)
        return left_ms * 2 > self.config.item_lease_s * 1000

    def _run_handler(self, work: Work, job: JobType, tr: Any) -> Any:
        running = Running(
            work,
            threading.get_ident(),
            self.clock.now(),
            None if job.execution_bound_s is None else time.monotonic() + job.execution_bound_s,
            transactional=tr is not None,
        )
        # Made at the handler's first report: most never report.
        reporters: list[ProgressReporter] = []

        def progress(fraction: float, note: str | None) -> None:
            if not reporters:
                write = lambda f, n: self.ops.progress(work, f, n, tr)  # noqa: E731
                reporters.append(reporter_for(write, tr is not None))
            reporters[0].report(fraction, note)

        ctx = JobContext(
            work.zone,
            work.item,
            tr=tr,
            lease_lost=running.lease_lost,
            cancel_event=work.cancelled,
            progress_to=progress,
            retry_meta=work.retry_meta,
        )
        try:
            self.in_flight.begin(running)
            return job.call(ctx)
        finally:
            for reporter in reporters:
                reporter.close()  # a held report is kept before the completion reads it
            self.in_flight.end(running)

"""Periodic jobs: cron schedules enqueued by any number of schedulers, with no leader.

    (root, "m", "periodic", name) -> LE i64: the last slot (ms) the schedule enqueued

Each slot of a schedule is enqueued under a deterministic item id (``periodic:<name>:<slot
ms>``) in the same transaction that moves the schedule's checkpoint past it. The
checkpoint is read with a conflict, so of several schedulers ticking at once one commits
and the others retry, see the checkpoint moved and enqueue nothing: exactly one item per
slot however many schedulers run, and a slot already enqueued (even completed and gone)
is never enqueued again. The id makes a retried commit (``commit_unknown_result``)
idempotent too.

Cron expressions are parsed by ``croniter`` and evaluated in the schedule's time zone
(``zoneinfo``), so "0 9 * * *" in Europe/Paris is 09:00 Paris time across DST changes.

After downtime, ``catch_up="latest"`` (the default) enqueues only the latest missed slot;
``catch_up="all"`` enqueues every missed slot (at most :data:`MAX_CATCH_UP` per tick).
A schedule seen for the first time starts at the next slot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from quickzones.clock import now_ms
from quickzones.errors import InvalidArgument, MissingDependency
from quickzones.store.kv import OWN_STORE, KVTransaction, pack_i64, run, transactional, unpack_i64
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.client import Quick

log = logging.getLogger("quick.periodic")

CATCH_UP = ("latest", "all")
# A schedule down for a long time with catch_up="all" enqueues this many slots per tick,
# so one transaction stays small; the next ticks take the rest.
MAX_CATCH_UP = 500
# A schedule name is part of every slot's item id (at most 200 characters).
MAX_NAME = 120


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError as err:
        raise MissingDependency("croniter", "periodic", str(err)) from err
    return croniter


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _check_seconds_field(cron: str) -> None:
    """croniter reads a sixth field as seconds, last; Quartz and node-cron put them first.
    "*/5 * * * * *" written for "every 5 seconds" would run every second of every fifth
    minute, sixty items a burst: every second within restricted minutes is refused
    unless spelled out (0-59)."""
    fields = cron.split()
    if len(fields) >= 6 and fields[5] == "*" and fields[0] != "*":
        raise InvalidArgument(
            "cron",
            cron,
            f"runs every second of the minutes {fields[0]!r} matches: seconds are the "
            f"sixth field here (croniter's order), not the first. Seconds first moved "
            f"last: '{' '.join([*fields[1:6], fields[0]])}'; every second of those "
            f"minutes: '{' '.join(fields[:5])} 0-59'",
        )


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule that enqueues ``job_type`` with ``payload`` into (app, tenant)."""

    name: str
    cron: str
    job_type: str
    app: str
    tenant: str
    payload: Any = b""
    tz: str = "UTC"
    catch_up: str = "latest"
    priority: int = 0

    def check(self) -> Schedule:
        check_name("schedule name", self.name)
        if len(self.name) > MAX_NAME:
            raise InvalidArgument("schedule name", self.name, f"longer than {MAX_NAME}")
        if not isinstance(self.cron, str) or not _croniter().is_valid(self.cron):
            raise InvalidArgument("cron", self.cron, "not a valid cron expression")
        _check_seconds_field(self.cron)
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise InvalidArgument("tz", self.tz, "not a known time zone") from None
        if self.catch_up not in CATCH_UP:
            raise InvalidArgument("catch_up", self.catch_up, "must be 'latest' or 'all'")
        return self

    def slots_after(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` slot times (ms) strictly after ``after_ms``, in its zone."""
        slots = self._slots(after_ms)
        return [next(slots) for _ in range(count)]

    def slots_between(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        """Slots in (after_ms, until_ms], at most ``limit`` (the earliest)."""
        out: list[int] = []
        for slot in self._slots(after_ms):
            if slot > until_ms or len(out) >= limit:
                break
            out.append(slot)
        return out

    def _slots(self, after_ms: int) -> Iterator[int]:
        """Slot times after ``after_ms``. When the clocks go back, a wall time happens
        twice; croniter matches both, and a job at a fixed hour ("30 2 * * *") would run
        twice that night. Like cron, it runs at the first only; an expression whose hour
        field is a wildcard ("*/30 * * * *") keeps its interval through both."""
        zone = ZoneInfo(self.tz)
        it = _croniter()(self.cron, datetime.fromtimestamp(after_ms / 1000, tz=zone))
        fixed_hour = not self.cron.split()[1].startswith("*")
        while True:
            at = it.get_next(float)
            if fixed_hour and datetime.fromtimestamp(at, tz=zone).fold:
                continue  # the repeat of a wall time already run an hour before
            yield _ms(at)

    def item_id(self, slot_ms: int) -> str:
        """The slot's deterministic item id: the same in every scheduler process."""
        return f"periodic:{self.name}:{slot_ms}"


class Scheduler:
    """Enqueues the due slots of a Quick's schedules. Run :meth:`tick` from any number of
    processes (``quick worker`` runs :meth:`start`); no leader is needed."""

    def __init__(
        self,
        quick: Quick,
        schedules: Sequence[Schedule] | None = None,
        *,
        interval_s: float = 0.25,
        lookahead_s: float = 0.5,
        collect_every_s: float = 10.0,
    ) -> None:
        self.quick = quick
        self.kv = quick.kv  # the store its ticks run on (see @transactional)
        self.schedules = list(quick.schedules if schedules is None else schedules)
        self.interval_s = interval_s
        # Slots this close ahead are enqueued now with the remaining delay, so they vest
        # on time instead of one tick late.
        self.lookahead_ms = int(lookahead_s * 1000)
        self.collect_every_s = collect_every_s
        # Per schedule, the next slot this process expects; a tick reads the store only
        # once that is near, so an idle scheduler costs one read per slot.
        self._next: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _checkpoint_key(self, schedule: Schedule) -> bytes:
        return self.quick.keys.meta_key("periodic", schedule.name)

    def _enqueued_key(self, schedule: Schedule) -> bytes:
        return self.quick.keys.meta_key("periodic_enqueued", schedule.name)

    def last_slot(self, schedule: Schedule) -> int | None:
        """The schedule's checkpoint (ms): every slot up to it is handled; None before
        the first tick. A first tick sets it to that moment, which is no slot: what was
        last enqueued is :meth:`last_enqueued`."""
        key = self._checkpoint_key(schedule)
        raw = run(self.quick.kv, lambda tr: tr.get(key, snapshot=True))
        return None if raw is None else unpack_i64(raw)

    def last_enqueued(self, schedule: Schedule) -> int | None:
        """The last slot whose item was enqueued (ms), or None while none was (a new
        schedule's first tick enqueues nothing; issue 28, point 12)."""
        key = self._enqueued_key(schedule)
        raw = run(self.quick.kv, lambda tr: tr.get(key, snapshot=True))
        return None if raw is None else unpack_i64(raw)

    def tick(self, now: int | None = None) -> int:
        """Enqueue every schedule's due slots; returns how many items this call wrote."""
        now = now_ms(self.quick.clock) if now is None else now
        written = 0
        for schedule in self.schedules:
            if self._next.get(schedule.name, -1) > now + self.lookahead_ms:
                continue
            try:
                written += self._tick(schedule, now)
            except Exception:
                # One bad schedule (its job type unknown to a strict client, the store
                # briefly down) must not stop the others; the next tick retries.
                log.warning("periodic schedule %s: tick failed", schedule.name, exc_info=True)
        return written

    @transactional
    def _tick(self, schedule: Schedule, now: int, *, tr: KVTransaction = OWN_STORE) -> int:
        """Enqueue one schedule's due slots and move its checkpoint, in one transaction."""
        key = self._checkpoint_key(schedule)
        raw = tr.get(key)  # a conflicting read: concurrent schedulers serialise here
        horizon = now + self.lookahead_ms
        if raw is None:
            # First sight: start at the next slot, never at one already past.
            tr.set(key, pack_i64(now))
            self._next[schedule.name] = schedule.slots_after(now, 1)[0]
            return 0
        last = unpack_i64(raw)
        due = schedule.slots_between(last, horizon, MAX_CATCH_UP)
        if not due:
            self._next[schedule.name] = schedule.slots_after(last, 1)[0]
            return 0
        if schedule.catch_up == "latest":
            missed = [s for s in due if s <= now]
            due = missed[-1:] + [s for s in due if s > now]
        # The clock's own reading, not the whole ms ``now``: the store rounds now + delay
        # up once, so a slot's item vests at the slot itself (``now`` given by a caller
        # that is not this clock's reading is taken as it is).
        at = self.quick.clock.now()
        if int(at * 1000) != now:
            at = now / 1000
        for slot in due:
            self.quick.enqueue(
                schedule.job_type,
                schedule.payload,
                app=schedule.app,
                tenant=schedule.tenant,
                item_id=schedule.item_id(slot),
                delay=max(0.0, slot / 1000 - at),
                priority=schedule.priority,
                tr=tr,
            )
        tr.set(key, pack_i64(due[-1]))
        tr.set(self._enqueued_key(schedule), pack_i64(due[-1]))  # a blind write
        self._next[schedule.name] = schedule.slots_after(due[-1], 1)[0]
        return len(due)

    def next_runs(self, schedule: Schedule, count: int = 3, now: int | None = None) -> list[int]:
        """The next ``count`` slots still to be enqueued."""
        now = now_ms(self.quick.clock) if now is None else now
        last = self.last_slot(schedule)
        return schedule.slots_after(max(now, last or now), count)

    # --- the loop ``quick worker`` runs ---------------------------------------------------

    def start(self) -> None:
        """Tick every ``interval_s`` in a daemon thread, and collect expired outcome
        records every ``collect_every_s`` (bounded batches)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="quick-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        collected_at = 0.0
        clock = self.quick.clock
        while not self._stop.is_set():
            self.tick()
            if self.collect_every_s and clock.now() - collected_at >= self.collect_every_s:
                collected_at = clock.now()
                try:
                    self.quick.collect_outcomes()
                except Exception:
                    log.warning("collecting expired outcome records failed", exc_info=True)
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def schedule_decorator(
    quick: Quick, schedule: Schedule
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What ``@q.periodic(...)`` returns: registers the function as the job type's
    handler when the type has none yet."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if quick.registry.find(schedule.job_type) is None:
            quick.job(schedule.job_type)(fn)
        return fn

    return register

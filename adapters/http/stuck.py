"""What the dashboard's "what is stuck" pages read (issue 45 point 4), each bounded by what
it shows, whatever the number of tenants:

* running items: a page of the running index (:mod:`quickzones.store.running`), each
  run's holder matched to a consumer by its heartbeat (at most 1,000 records), and its
  time so far set against its job type's p99 of the last hour (:mod:`..run_figures`,
  a histogram of run times the store keeps per type, written when runs end);
* failed runs per job type per minute: the last hour's counters (:mod:`..run_figures`);
* dead letters by (job type, error): the group counters (:mod:`..dead_groups`), and a
  group's requeue, at most :data:`GROUP_REQUEUE_MAX` letters a request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.store import admin, dead_groups, heartbeats, run_figures, running
from quickzones.store.pages import Page
from quickzones.store.pickups import percentile_label
from quickzones.store.records import DeadLetter

if TYPE_CHECKING:
    from quickzones.client import Quick

# Runs of a type in the hour before its p99 is trusted to flag one as slow: with fewer,
# one odd run would be "the usual".
MIN_RUNS = 10
# Letters of a group one requeue request moves at most, and letters of the group's job
# type it reads at most looking for them (the rest: a "continue" from its cursor).
GROUP_REQUEUE_MAX = 100
GROUP_READ_MAX = 1000


@dataclass(frozen=True, slots=True)
class RunningRow:
    run: running.Running
    consumer: str  # the consumer id, or what is known of the holder
    running_ms: int
    p99: str  # the type's usual p99 as shown, "-" without enough runs
    slow: bool  # running longer than that p99


def consumer_names(q: Quick) -> dict[str, list[str]]:
    """``host:pid`` -> the consumers beating from that process."""
    names: dict[str, list[str]] = {}
    for beat in heartbeats.heartbeats(q.kv, q.keys):
        names.setdefault(f"{beat.host}:{beat.pid}", []).append(beat.consumer_id)
    return names


def _consumer_of(holder: str, names: dict[str, list[str]]) -> str:
    found = sorted(names.get(holder, []))
    if len(found) == 1:
        return found[0]
    if found:  # several consumers in one process: which of them is not recorded
        return f"one of {', '.join(found)}"
    return f"{holder} (no heartbeat)"


def running_page(q: Quick, app: str, limit: int, cursor: str | None) -> Page[RunningRow]:
    """A page of ``app``'s running items, longest running first."""
    now = now_ms(q.clock)
    page = running.running_page(q.kv, q.keys, app, now, limit=limit, cursor=cursor)
    if not page.rows:
        return Page([], page.next_cursor)
    names = consumer_names(q)
    usual = run_figures.runtimes(q.kv, q.keys, app, {r.job_type for r in page.rows}, now)
    rows = []
    for r in page.rows:
        histogram = usual[r.job_type]
        p99 = histogram.percentile(0.99) if histogram.total >= MIN_RUNS else None
        ran = max(0, now - r.since_ms)
        rows.append(
            RunningRow(
                r, _consumer_of(r.holder, names), ran, percentile_label(p99),
                slow=p99 is not None and ran > p99,
            )
        )  # fmt: skip
    return Page(rows, page.next_cursor)


@dataclass(frozen=True, slots=True)
class Errors:
    minutes: list[run_figures.ErrorMinute]
    hour: Counter[str]  # failed runs per type in the hour
    recent: Counter[str]  # in the last five minutes


def errors(q: Quick, app: str) -> Errors:
    minutes = run_figures.error_history(q.kv, q.keys, app, now_ms(q.clock))
    hour: Counter[str] = Counter()
    recent: Counter[str] = Counter()
    for n, m in enumerate(minutes):
        hour.update(m.by_type)
        if n >= len(minutes) - 5:
            recent.update(m.by_type)
    return Errors(minutes, hour, recent)


@dataclass(frozen=True, slots=True)
class GroupRequeue:
    requeued: int
    skipped: int  # kept (its id queued again) or requeued by someone else meanwhile
    next_cursor: str | None  # more of the group may follow from here


def requeue_group(
    q: Quick, app: str, job_type: str, error: str, cursor: str | None
) -> GroupRequeue:
    """Requeue the dead letters of one group (``job_type``, ``error``) from ``cursor``:
    the job type's letters are read a page at a time and those of the group requeued
    (:func:`quickzones.store.admin.requeue`), at most :data:`GROUP_REQUEUE_MAX` moved and
    :data:`GROUP_READ_MAX` read a request; the cursor says where the next goes on."""
    taken: list[DeadLetter] = []
    read = 0
    while True:
        room = GROUP_REQUEUE_MAX - len(taken)  # so no page reads past the bound
        page = admin.dead_letter_page(q, app, job_type=job_type, limit=room, cursor=cursor)
        for letter in page.rows:
            read += 1
            if letter.item is not None and dead_groups.error_of(letter.reason) == error:
                taken.append(letter)
        cursor = page.next_cursor
        if cursor is None or len(taken) >= GROUP_REQUEUE_MAX or read >= GROUP_READ_MAX:
            break
    moved = admin.requeue(q, taken)
    skipped = len(moved.kept) + len(moved.corrupt) + moved.gone
    return GroupRequeue(moved.requeued, skipped, cursor)

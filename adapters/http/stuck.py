"""What the dashboard's "what is stuck" pages read (issue 45 point 4), each bounded by what
it shows, whatever the number of tenants:

* running items: the live consumers' heartbeat records (:mod:`quickzones.store.heartbeats`:
  each lists what its consumer runs now, at most 100, and ``quick serve``'s its pull
  leases; at most 1,000 records), each item's consumer the record's, and its time so far
  set against its job type's p99 of the last hour (:mod:`..run_figures`, a histogram of
  run times consumers count and add with their pickup counts);
* failed runs per job type per minute: the last hour's counters (:mod:`..run_figures`);
* dead letters by (job type, error): the group counters (:mod:`..dead_groups`), and a
  group's requeue, at most :data:`GROUP_REQUEUE_MAX` letters a request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quickzones.clock import now_ms
from quickzones.store import admin, dead_groups, heartbeats, run_figures
from quickzones.store.heartbeats import RunningItem
from quickzones.store.pages import Page
from quickzones.store.pickups import Histogram, percentile_label
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
    run: RunningItem
    consumer: str  # the consumer id of the record listing it
    running_ms: int
    p99: str  # the type's usual p99 as shown, "-" without enough runs
    slow: bool  # running longer than that p99
    lapsed: bool  # its lease ran out unrenewed


@dataclass(frozen=True, slots=True)
class Running:
    page: Page[RunningRow]
    unlisted: int  # running on live consumers beyond what their records list (any app)


def running_page(q: Quick, app: str, limit: int, cursor: str | None) -> Running:
    """A page of ``app``'s running items, longest running first."""
    now = now_ms(q.clock)
    beats = [b for b in heartbeats.heartbeats(q.kv, q.keys, running=True) if not b.stale(now)]
    unlisted = sum(b.running_more for b in beats)
    page = heartbeats.running_page(beats, app, now, limit=limit, cursor=cursor)
    if not page.rows:
        return Running(Page([], page.next_cursor), unlisted)
    job_types = {r.job_type for _, r in page.rows}
    usual = run_figures.runtimes(q.kv, q.keys, app, job_types, now)
    rows = []
    for beat, r in page.rows:
        histogram = Histogram(usual[r.job_type])
        p99 = histogram.percentile(0.99) if histogram.total >= MIN_RUNS else None
        ran = max(0, now - r.since_ms)
        rows.append(
            RunningRow(
                r, beat.consumer_id, ran, percentile_label(p99),
                slow=p99 is not None and ran > p99, lapsed=r.lapsed(now),
            )
        )  # fmt: skip
    return Running(Page(rows, page.next_cursor), unlisted)


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

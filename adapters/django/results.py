"""Django's ``TaskResult`` read from quick: a live item (READY, or RUNNING while its
handler runs), a completed one's kept outcome (SUCCESSFUL, with its return value) or a
dead letter (FAILED, with the handler's traceback). What quick no longer knows does not
exist.

Its runs (:mod:`.runs`): ``errors`` one per failed run (the first and the newest kept),
``worker_ids`` one per run, ``attempts`` quick's count of runs. Its times:
``enqueued_at`` the item's enqueue; ``started_at`` its first run's start;
``last_attempted_at`` its newest run's start; ``finished_at`` when it completed or was
dead-lettered. A task that has not run has no start. A task RUNNING, read from another
process, shows its run's start and worker from the consumers' heartbeats (the read the
dashboard's "running now" makes: every live consumer's list of what it runs, at most 100
items each), within a beat (5 s) of its start; before that, its failed runs' alone."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from quickzones.adapters.django.compat import (
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    set_field,
)
from quickzones.adapters.django.jobs import (
    ARGS,
    ENQUEUED,
    KWARGS,
    RETURN_VALUE,
    STARTED,
    STARTED_NOTE,
    TASK,
    WORKER,
    item_payload,
    load_task,
)
from quickzones.adapters.django.runs import WORKER_ID, History, Run, history_of
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.errors import InvalidArgument
from quickzones.store import heartbeats
from quickzones.store.outcomes import COMPLETED, DEAD_LETTERED, ResultNotAvailable
from quickzones.store.records import WorkItem, ZoneId

# A result id names the item and its tenant ("<item id>:<tenant>"): get_result needs the
# zone, and quick's item ids never hold a colon, so the first one splits them.
_SEP = ":"
# The last line of a Python traceback: "module.Class: message" ("Class" for builtins).
_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# The note the task's handler adds to a failing run's exception (jobs.STARTED_NOTE); the
# worker part is absent from notes written before it was added.
_NOTE = re.compile(
    "^"
    + re.escape(STARTED_NOTE)
    .replace(r"\{ms\}", r"(\d+)")
    .replace(re.escape(" on {worker}"), r"(?: on (\S+))?")
    + "$",
    re.M,
)


def result_id(item_id: str, tenant: str) -> str:
    return f"{item_id}{_SEP}{tenant}"


def parse_result_id(rid: str) -> tuple[str, str]:
    item_id, sep, tenant = str(rid).partition(_SEP)
    if not (sep and item_id and tenant):
        raise TaskResultDoesNotExist(f"{rid!r} is not a result id of this backend")
    return item_id, tenant


def timestamp(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def read_result(quick: Quick, app: str, alias: str, rid: str) -> Any:
    """The TaskResult of ``rid``, or TaskResultDoesNotExist."""
    item_id, tenant = parse_result_id(rid)
    zone = ZoneId(app, tenant)
    try:
        item = quick.get(app, tenant, item_id)
        if item is not None:
            return _live(quick, alias, rid, zone, item)
        finished = quick.status(app, tenant, item_id)
    except InvalidArgument as err:
        raise TaskResultDoesNotExist(f"{rid!r}: {err}") from err
    if finished is None:
        raise TaskResultDoesNotExist(f"no task {rid!r} (never enqueued, or its record expired)")
    if finished.state == COMPLETED:
        try:
            kept = quick.result(app, tenant, item_id)
        except ResultNotAvailable as err:
            raise TaskResultDoesNotExist(f"{rid!r}: {err.reason}") from err
        started = _ms(kept.get(STARTED))
        last = None if started is None else Run(started, str(kept.get(WORKER) or WORKER_ID))
        result = _result(alias, rid, kept, TaskResultStatus.SUCCESSFUL, history_of(kept), last,
                         attempts=finished.attempts, enqueued=_ms(kept.get(ENQUEUED)),
                         finished=finished.at_ms)  # fmt: skip
        set_field(result, "_return_value", kept.get(RETURN_VALUE))
        return result
    if finished.state == DEAD_LETTERED:
        letter = quick.zones.read_dead_letter(zone, item_id)
        if letter is None or letter.item is None:
            raise TaskResultDoesNotExist(f"{rid!r}: its dead letter is gone or unreadable")
        trace, started, worker = _started_note(letter.traceback or letter.reason)
        final = Run(started, worker, (_raised(trace), trace))
        return _result(alias, rid, item_payload(letter.item), TaskResultStatus.FAILED,
                       history_of(letter.item.meta), final, attempts=finished.attempts,
                       enqueued=letter.item.enqueued_ms, finished=finished.at_ms)  # fmt: skip
    # Cancelled (quick cancel): Django has no such state; it failed to run.
    return _result(alias, rid, {}, TaskResultStatus.FAILED, History(), None,
                   attempts=finished.attempts, finished=finished.at_ms)  # fmt: skip


def _live(quick: Quick, alias: str, rid: str, zone: ZoneId, item: WorkItem) -> Any:
    """A queued item's result: READY (never run, waiting for a retry, or leased ahead of
    its start), or RUNNING with its run as the consumers' heartbeats list it."""
    history = history_of(item.meta)
    body = item_payload(item)
    if item.lease_id is None or item.held:
        return _result(alias, rid, body, TaskResultStatus.READY, history, None,
                       attempts=item.attempts, enqueued=item.enqueued_ms)  # fmt: skip
    current = None
    beats = heartbeats.heartbeats(quick.kv, quick.keys, running=True)
    listed = heartbeats.running_now(beats, zone, item.item_id, now_ms(quick.clock))
    if listed is not None and listed[1].attempts == item.attempts:  # this run, not a lapsed one
        beat, running = listed
        current = Run(running.since_ms, f"{beat.host}:{beat.pid}")
    return _result(alias, rid, body, TaskResultStatus.RUNNING, history, current,
                   attempts=item.attempts, enqueued=item.enqueued_ms)  # fmt: skip


def _result(
    alias: str,
    rid: str,
    body: dict[str, Any],
    status: Any,
    history: History,
    last: Run | None,
    *,
    attempts: int,
    enqueued: int | None = None,
    finished: int | None = None,
) -> Any:
    """``last``: the run after ``history``'s failed ones, where one is known (the one
    that succeeded, runs now, or was dead-lettered: its error then)."""
    if TASK not in body:
        raise TaskResultDoesNotExist(f"{rid!r} is not a Django task's item")
    errors = history.errors(last)
    newest = history.newest_ms() if last is None else last.started_ms
    first = history.first_ms if history.first_ms is not None else newest
    return TaskResult(
        task=load_task(body[TASK]),
        id=rid,
        status=status,
        enqueued_at=timestamp(enqueued),
        started_at=timestamp(first),
        finished_at=timestamp(finished),
        last_attempted_at=timestamp(newest),
        args=body.get(ARGS, []),
        kwargs=body.get(KWARGS, {}),
        backend=alias,
        errors=[TaskError(exception_class_path=p, traceback=t) for p, t in errors],
        worker_ids=history.worker_ids(attempts, last),
    )


def _ms(value: object) -> int | None:
    """A time kept with a result (None in results kept before it was)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _started_note(trace: str) -> tuple[str, int | None, str]:
    """A failed run's traceback without the handler's note, and the start and worker it
    noted."""
    found = _NOTE.findall(trace)
    if not found:
        return trace, None, WORKER_ID
    started, worker = found[-1]
    return _NOTE.sub("", trace).rstrip("\n"), int(started), worker or WORKER_ID


def _raised(trace: str) -> str:
    """The exception's class path from a traceback's last line."""
    lines = [line for line in trace.strip().splitlines() if line and not line[0].isspace()]
    found = _RAISED.match(lines[-1]) if lines else None
    if found is None:
        return "builtins.Exception"
    name = found.group(1)
    return name if "." in name else f"builtins.{name}"

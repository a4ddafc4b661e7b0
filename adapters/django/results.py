"""Django's ``TaskResult`` read from quick: a live item (READY, or RUNNING while leased),
a completed one's kept outcome (SUCCESSFUL, with its return value) or a dead letter
(FAILED, with the handler's traceback). What quick no longer knows does not exist.

Its times: ``enqueued_at`` the item's enqueue; ``started_at`` and ``last_attempted_at``
when its last run started (Django's reference backends set both at each run's start),
kept with the result by the task's handler (:mod:`.jobs`) or, for a failed run, noted
with its exception; ``finished_at`` when it completed or was dead-lettered. A task that
has not run has no start; one running, read from another process, shows none either
(quick keeps no start time in the item)."""

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
    WORKER_ID,
    item_payload,
    load_task,
)
from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.store.outcomes import COMPLETED, DEAD_LETTERED, ResultNotAvailable
from quickzones.store.records import ZoneId

# A result id names the item and its tenant ("<item id>:<tenant>"): get_result needs the
# zone, and quick's item ids never hold a colon, so the first one splits them.
_SEP = ":"
# The last line of a Python traceback: "module.Class: message" ("Class" for builtins).
_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# The note the task's handler adds to a failing run's exception (jobs.STARTED_NOTE).
_NOTE = re.compile("^" + re.escape(STARTED_NOTE).replace(r"\{ms\}", r"(\d+)") + "$", re.M)


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
    try:
        item = quick.get(app, tenant, item_id)
        if item is not None:
            status = TaskResultStatus.RUNNING if item.lease_id else TaskResultStatus.READY
            return _result(alias, rid, item_payload(item), status, enqueued=item.enqueued_ms,
                           attempts=item.attempts)  # fmt: skip
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
        result = _result(alias, rid, kept, TaskResultStatus.SUCCESSFUL, finished=finished.at_ms,
                         attempts=finished.attempts, enqueued=_ms(kept.get(ENQUEUED)),
                         started=_ms(kept.get(STARTED)))  # fmt: skip
        set_field(result, "_return_value", kept.get(RETURN_VALUE))
        return result
    if finished.state == DEAD_LETTERED:
        letter = quick.zones.read_dead_letter(ZoneId(app, tenant), item_id)
        if letter is None or letter.item is None:
            raise TaskResultDoesNotExist(f"{rid!r}: its dead letter is gone or unreadable")
        trace, started = _started_note(letter.traceback or letter.reason)
        failed = _result(alias, rid, item_payload(letter.item), TaskResultStatus.FAILED,
                         enqueued=letter.item.enqueued_ms, finished=finished.at_ms,
                         attempts=finished.attempts, started=started)  # fmt: skip
        failed.errors.append(TaskError(exception_class_path=_raised(trace), traceback=trace))
        return failed
    # Cancelled (quick cancel): Django has no such state; it failed to run.
    return _result(alias, rid, {}, TaskResultStatus.FAILED, finished=finished.at_ms,
                   attempts=finished.attempts)  # fmt: skip


def _result(
    alias: str,
    rid: str,
    body: dict[str, Any],
    status: Any,
    *,
    attempts: int,
    enqueued: int | None = None,
    started: int | None = None,
    finished: int | None = None,
) -> Any:
    if TASK not in body:
        raise TaskResultDoesNotExist(f"{rid!r} is not a Django task's item")
    return TaskResult(
        task=load_task(body[TASK]),
        id=rid,
        status=status,
        enqueued_at=timestamp(enqueued),
        started_at=timestamp(started),
        finished_at=timestamp(finished),
        last_attempted_at=timestamp(started),
        args=body.get(ARGS, []),
        kwargs=body.get(KWARGS, {}),
        backend=alias,
        errors=[],
        worker_ids=[WORKER_ID] * attempts,
    )


def _ms(value: object) -> int | None:
    """A time kept with a result (None in results kept before it was)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _started_note(trace: str) -> tuple[str, int | None]:
    """A failed run's traceback without the handler's note, and the start it noted."""
    found = _NOTE.findall(trace)
    if not found:
        return trace, None
    return _NOTE.sub("", trace).rstrip("\n"), int(found[-1])


def _raised(trace: str) -> str:
    """The exception's class path from a traceback's last line."""
    lines = [line for line in trace.strip().splitlines() if line and not line[0].isspace()]
    found = _RAISED.match(lines[-1]) if lines else None
    if found is None:
        return "builtins.Exception"
    name = found.group(1)
    return name if "." in name else f"builtins.{name}"

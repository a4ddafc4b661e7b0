"""A Django task as a quick job type: its name, its item's payload and the handler that
runs it. The producer (the backend, at enqueue) and the worker (``worker_app``) register
tasks through :func:`register_task` alone, so both agree on the job type, its retry policy
and how long its outcome is kept (the enqueue stores that policy in the item)."""

from __future__ import annotations

import json
import time
from typing import Any

from django.db import close_old_connections
from django.utils.module_loading import import_string

from quickzones.adapters.django.compat import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
)
from quickzones.adapters.django.options import BackendOptions, retry_of
from quickzones.client import Quick
from quickzones.registry import JobContext
from quickzones.store.records import WorkItem

# The item's payload: {"task": module path, "args": [...], "kwargs": {...}}; the kept
# result: the same with "return_value" added, so a finished task's result needs no item.
TASK, ARGS, KWARGS, RETURN_VALUE = "task", "args", "kwargs", "return_value"
# Django's TaskResult lists the workers that ran a task; quick's items count attempts.
WORKER_ID = "quick"
# Kept with the result too: when the item was enqueued and when its last run started
# (ms), so a finished task's enqueued_at, started_at and last_attempted_at are known
# (issue 41 point 12: they were None).
ENQUEUED, STARTED = "enqueued_ms", "started_ms"
# A failed run's start goes with its exception, as a note: the dead letter keeps the
# traceback, and results.py reads the time back from it (and leaves the note out).
STARTED_NOTE = "quick: this run started at {ms} ms"


def job_type(task: Any) -> str:
    """The quick job type of a task: its module path (``shop.tasks.send_receipt``)."""
    return str(task.module_path)


def payload(task: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    return {TASK: task.module_path, ARGS: args, KWARGS: kwargs}


def item_payload(item: WorkItem) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(item.payload) if item.content_type == "json" else {}
    return body


def load_task(path: str) -> Any:
    """The ``Task`` a module path names (the module-level name ``@task`` bound)."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path} is not a Django task (decorate it with @task)")
    return found


def register_task(quick: Quick, task: Any, options: BackendOptions, alias: str) -> str:
    """Make ``task`` a job type of ``quick`` (once): its handler runs the task, retried
    as its policy says (its ``task_retry`` entry, else the backend's ``retry``); its
    outcome (status, return value) is kept ``keep_result_s``."""
    name = job_type(task)
    if quick.registry.find(name) is None:
        quick.job(
            name,
            retry=retry_of(options, name),
            keep_status_s=options.keep_result_s,
            keep_result_s=options.keep_result_s,
            # A producer registers at enqueue, maybe inside Django's transaction: the
            # registration writes nothing (the policy is stored by the worker's start).
        )(_runner(alias))
    return name


def _runner(alias: str) -> Any:
    def run(body: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        task = load_task(body[TASK])
        args, kwargs = list(body[ARGS]), dict(body[KWARGS])
        started = int(time.time() * 1000)  # the store's clock is the system's in a worker
        # A long-running worker is Django's request loop here: drop connections that
        # died or outlived CONN_MAX_AGE before and after each task.
        close_old_connections()
        try:
            if task.takes_context:
                running = running_result(task, alias, ctx, args, kwargs, started)
                value = task.call(TaskContext(task_result=running), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
        except Exception as err:
            err.add_note(STARTED_NOTE.format(ms=started))
            raise
        finally:
            close_old_connections()
        return {
            **body,
            RETURN_VALUE: normalize_json(value),
            ENQUEUED: ctx.item.enqueued_ms,
            STARTED: started,
        }

    return run


def running_result(
    task: Any,
    alias: str,
    ctx: JobContext,
    args: list[Any],
    kwargs: dict[str, Any],
    started_ms: int,
) -> Any:
    """The TaskResult a ``takes_context`` task sees while it runs (``context.attempt``);
    ``started_ms``: when this run started (its started_at and last_attempted_at, as
    Django's reference backends set both at each run's start)."""
    from quickzones.adapters.django.results import result_id, timestamp

    return TaskResult(
        task=task,
        id=result_id(ctx.item_id, ctx.tenant),
        status=TaskResultStatus.RUNNING,
        enqueued_at=timestamp(ctx.item.enqueued_ms),
        started_at=timestamp(started_ms),
        finished_at=None,
        last_attempted_at=timestamp(started_ms),
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[],
        worker_ids=[WORKER_ID] * max(1, ctx.item.attempts),
    )

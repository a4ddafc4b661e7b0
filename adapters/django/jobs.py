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
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
)
from quickzones.adapters.django.options import BackendOptions, retry_of
from quickzones.adapters.django.runs import RUNS, History, Run, failed_run, history_of, worker_id
from quickzones.client import Quick
from quickzones.registry import JobContext
from quickzones.store.records import WorkItem

# The item's payload: {"task": module path, "args": [...], "kwargs": {...}}; the kept
# result: the same with "return_value" added, so a finished task's result needs no item.
TASK, ARGS, KWARGS, RETURN_VALUE = "task", "args", "kwargs", "return_value"
# Kept with the result too: when the item was enqueued, when its last run started (ms)
# and on which worker, so a finished task's enqueued_at, started_at, last_attempted_at
# and worker_ids are known (issue 41 point 12: they were None); the failed runs before
# it under runs.RUNS, where there were some.
ENQUEUED, STARTED, WORKER = "enqueued_ms", "started_ms", "worker"
# A failed run's start and worker go with its exception, as a note: the dead letter
# keeps the traceback, and results.py reads them back from it (and leaves the note out).
STARTED_NOTE = "quick: this run started at {ms} ms on {worker}"


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
        worker = worker_id()
        # The failed runs before this one: an inline retry's are in what its failed run
        # left for the requeue, not yet in the item.
        history = history_of(ctx.retry_meta if RUNS in ctx.retry_meta else ctx.item.meta)
        # A long-running worker is Django's request loop here: drop connections that
        # died or outlived CONN_MAX_AGE before and after each task.
        close_old_connections()
        try:
            if task.takes_context:
                running = running_result(
                    task, alias, ctx, args, kwargs, history, Run(started, worker)
                )
                value = task.call(TaskContext(task_result=running), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
        except Exception as err:
            # Merged into the item by the retry's requeue, if it is retried.
            failed = history.with_failure(failed_run(err, started, worker))
            ctx.retry_meta[RUNS] = failed.stored()
            err.add_note(STARTED_NOTE.format(ms=started, worker=worker))
            raise
        finally:
            close_old_connections()
        kept = {
            **body,
            RETURN_VALUE: normalize_json(value),
            ENQUEUED: ctx.item.enqueued_ms,
            STARTED: started,
            WORKER: worker,
        }
        if history.failed:
            kept[RUNS] = history.stored()
        return kept

    return run


def running_result(
    task: Any,
    alias: str,
    ctx: JobContext,
    args: list[Any],
    kwargs: dict[str, Any],
    history: History,
    run: Run,
) -> Any:
    """The TaskResult a ``takes_context`` task sees while it runs (``context.attempt``,
    its worker_ids' length, is quick's count of runs): the failed runs before it
    (``history``) and this ``run``."""
    from quickzones.adapters.django.results import result_id, timestamp

    return TaskResult(
        task=task,
        id=result_id(ctx.item_id, ctx.tenant),
        status=TaskResultStatus.RUNNING,
        enqueued_at=timestamp(ctx.item.enqueued_ms),
        started_at=timestamp(history.first_ms or run.started_ms),
        finished_at=None,
        last_attempted_at=timestamp(run.started_ms),
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[TaskError(exception_class_path=p, traceback=t) for p, t in history.errors()],
        worker_ids=history.worker_ids(ctx.attempt, run),
    )

"""A Django task's runs across its retries: what Django's ``TaskResult`` shows of them
(``errors``: one per failed run; ``worker_ids``: one per run; ``started_at``: the first
run's start; ``last_attempted_at``: the newest run's).

Where it is kept, at no write of its own: a failed run that is retried leaves its error,
start and worker in the item's metadata (key :data:`RUNS`) through
``JobContext.retry_meta``, which the retry's own requeue merges in; the run that succeeds
carries them into its kept result (the completion's write); a dead letter keeps the item
with them, its last run's error being the dead letter's traceback. The success path
writes nothing more than before.

Bounded: the history keeps the first failed run and the :data:`KEEP_NEWEST` newest, each
traceback at most :data:`TRACE_BYTES`, and counts the rest, so a task retried a thousand
times keeps five entries at most; ``worker_ids`` still has one entry per run, the runs not
kept showing :data:`WORKER_ID`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from quickzones.consumer.failure_log import format_failure

RUNS = "django_runs"  # the item's metadata key, and the kept result's
KEEP_NEWEST = 4  # failed runs kept besides the first
TRACE_LINES, TRACE_BYTES = 40, 4096  # one kept traceback at most (the middle cut)
_FIRST, _FAILED, _KEPT = "first", "failed", "kept"
# Django's TaskResult lists the workers that ran a task; a run this does not know of
# (one of those not kept, or one before this was kept) shows this.
WORKER_ID = "quick"


def worker_id() -> str:
    """This process as a worker: ``host:pid``, as quick's consumer heartbeats name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a task: its start (ms; None where it is not known, as in a dead letter
    written before starts were noted), its worker and, where it failed, the exception's
    class path and traceback."""

    started_ms: int | None
    worker: str
    error: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class History:
    """The failed runs of a task kept so far: the first and the newest, and how many
    failed in all (``failed`` >= ``len(kept)``)."""

    first_ms: int | None = None
    failed: int = 0
    kept: tuple[Run, ...] = ()

    def with_failure(self, run: Run) -> History:
        kept = (*self.kept, run)
        if len(kept) > KEEP_NEWEST + 1:
            kept = (kept[0], *kept[-KEEP_NEWEST:])
        first = run.started_ms if self.first_ms is None else self.first_ms
        return History(first, self.failed + 1, kept)

    def newest_ms(self) -> int | None:
        return self.kept[-1].started_ms if self.kept else None

    def stored(self) -> dict[str, Any]:
        """As the item's metadata (msgpack) and the kept result (JSON) hold it."""
        rows = [[r.started_ms, r.worker, *(r.error or ("", ""))] for r in self.kept]
        return {_FIRST: self.first_ms, _FAILED: self.failed, _KEPT: rows}

    def errors(self, last: Run | None = None) -> list[tuple[str, str]]:
        """Each kept failed run's (class path, traceback), ``last`` where it failed (a
        final run not in the history: a dead letter's) bounded in as the history is."""
        runs = self.kept if last is None or last.error is None else self.with_failure(last).kept
        return [r.error for r in runs if r.error is not None]

    def worker_ids(self, attempts: int, last: Run | None = None) -> list[str]:
        """One worker per run, ``attempts`` of them: the first failed run's, the runs not
        kept as :data:`WORKER_ID`, the newest failed runs', then ``last``'s (the run that
        succeeded, runs now, or was dead-lettered)."""
        known = [r.worker for r in self.kept] + ([] if last is None else [last.worker])
        missing = attempts - len(known)
        if missing < 0:
            return known[-attempts:] if attempts > 0 else []
        return known[:1] + [WORKER_ID] * missing + known[1:]


def history_of(meta: object) -> History:
    """The history an item's metadata or a kept result holds (none where it holds none,
    or one this did not write)."""
    if not isinstance(meta, dict) or not isinstance(meta.get(RUNS), dict):
        return History()
    got = meta[RUNS]
    kept = []
    for row in got.get(_KEPT) or []:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], int)):
            continue
        started, worker, path, trace = row
        kept.append(Run(started, str(worker), (str(path), str(trace)) if path else None))
    first = got.get(_FIRST)
    failed = got.get(_FAILED)
    return History(
        first if isinstance(first, int) else None,
        max(len(kept), failed if isinstance(failed, int) else 0),
        tuple(kept),
    )


def failed_run(err: BaseException, started_ms: int, worker: str) -> Run:
    """A run that raised ``err``: its class path as Django names it, its traceback
    bounded (the first frames and the last lines kept)."""
    kind = type(err)
    trace = format_failure(err, max_lines=TRACE_LINES, max_bytes=TRACE_BYTES)
    return Run(started_ms, worker, (f"{kind.__module__}.{kind.__qualname__}", trace))

"""Batches and chains as a producer spells them (issue 31, point 5; docs/batches.md).

``Quick.enqueue_batch(jobs, app=..., callback=Job(...))`` enqueues the jobs (any tenants
of one app) and, once every one has finished, the callback: in the transaction that
finishes the last of them (:mod:`quickzones.store.batches`). ``Quick.chain(a, b, c,
app=...)`` runs b after a completed and c after b. The names follow the peers: Celery's
group/chord/chain, Oban Pro's Batch with its callback, Dramatiq's pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from quickzones.errors import InvalidArgument
from quickzones.store import batches as stored
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_name
from quickzones.store.zones.items import new_item_id

if TYPE_CHECKING:
    from quickzones.client import Quick


@dataclass(frozen=True, slots=True)
class Job:
    """One job of a batch or chain, or a batch's callback: what ``Quick.enqueue`` takes,
    the app given once for the whole batch."""

    job_type: str
    payload: Any = None
    tenant: str = ""
    delay: float | timedelta = 0.0
    priority: int = 0
    item_id: str | None = None
    ttl: float | None = None
    run_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """An enqueued batch: its id (for ``Quick.batch_status``), its items' ids in the order
    given, and the id its callback will have."""

    id: str
    item_ids: list[str]
    callback_id: str


@dataclass(frozen=True, slots=True)
class Chain:
    """An enqueued chain: its id, each step's item id, and the batch of each step but the
    last (``Quick.batch_status`` of ``batch_ids[n]`` says how step n ended)."""

    id: str
    item_ids: list[str]
    batch_ids: list[str]


def _member(q: Quick, app: str, job: Job, *, in_batch: bool) -> stored.Member:
    if not isinstance(job, Job):
        raise InvalidArgument("job", job, "must be a quickzones.Job")
    zone = ZoneId(app, check_name("tenant", job.tenant))
    new = q._new_item(
        job.job_type, job.payload, job.delay, job.priority, job.item_id, job.ttl, None, job.run_at
    )
    if in_batch and new.delivery == "at_most_once":
        # Its item is deleted when it starts, before it finishes: no transaction finishes it.
        raise InvalidArgument(
            "job_type",
            job.job_type,
            "is at-most-once; a batch or chain waits on at-least-once jobs",
        )
    return stored.Member(zone, new)


def _batch_writer(q: Quick) -> stored.BatchWriter:
    q._require(
        "batches", "batches and chains", "the callback commits with the last item's completion"
    )
    return q.zones


def enqueue_batch(
    q: Quick,
    jobs: Sequence[Job],
    *,
    app: str,
    callback: Job,
    fail_fast: bool = False,
    batch_id: str | None = None,
) -> Batch:
    """:meth:`Quick.enqueue_batch`."""
    check_name("app", app)
    zones = _batch_writer(q)
    if not jobs:
        raise InvalidArgument("jobs", jobs, "a batch needs at least one job")
    members = [_member(q, app, job, in_batch=True) for job in jobs]
    back = _member(q, app, callback, in_batch=False)
    if back.item.content_type != "json":
        raise InvalidArgument(
            "callback payload",
            callback.payload,
            "must be JSON (the callback receives it inside the batch's report)",
        )
    if batch_id is None:
        batch_id = new_item_id(q.ids)
    else:
        check_name("batch_id", batch_id)
    stored.enqueue_batch(
        q.kv,
        zones,
        app,
        batch_id,
        members,
        back,
        fail_fast=bool(fail_fast),
        charge=lambda tr: q.limits.charge_enqueue(tr, app, len(members)),
    )
    q._wake_consumers()
    return Batch(batch_id, [str(m.item.item_id) for m in members], str(back.item.item_id))


def chain(q: Quick, steps: Sequence[Job], *, app: str) -> Chain:
    """:meth:`Quick.chain`."""
    check_name("app", app)
    zones = _batch_writer(q)
    if len(steps) < 2:
        raise InvalidArgument("steps", len(steps), "a chain needs at least two jobs")
    members = [_member(q, app, job, in_batch=n < len(steps) - 1) for n, job in enumerate(steps)]
    chain_id = new_item_id(q.ids)
    stored.enqueue_chain(
        q.kv, zones, app, chain_id, members, charge=lambda tr: q.limits.charge_enqueue(tr, app)
    )
    q._wake_consumers()
    return Chain(
        chain_id,
        [str(m.item.item_id) for m in members],
        [stored.chain_batch_id(chain_id, n) for n in range(len(steps) - 1)],
    )


def enqueue_after(q: Quick, after: str | tuple[str, str], app: str, then: stored.Member) -> str:
    """:meth:`Quick.enqueue` with ``after``: ``then`` waits for the job ``after`` names (its
    id in ``then``'s tenant, or (tenant, id)) to complete."""
    zones = _batch_writer(q)
    if isinstance(after, str):
        tenant, first_id = then.zone.tenant, after
    elif isinstance(after, tuple) and len(after) == 2:
        tenant, first_id = after
    else:
        raise InvalidArgument("after", after, "must be a job id or a (tenant, job id) pair")
    first = ZoneId(app, check_name("tenant", tenant))
    check_name("after", first_id)
    batch_id = new_item_id(q.ids)
    stored.enqueue_after(q.kv, zones, first, first_id, then, batch_id, q._now())
    q._wake_consumers()
    return str(then.item.item_id)


def batch_status(q: Quick, app: str, batch_id: str) -> stored.BatchStatus | None:
    """:meth:`Quick.batch_status`."""
    return stored.status(q.kv, q.keys, check_name("app", app), check_name("batch_id", batch_id))

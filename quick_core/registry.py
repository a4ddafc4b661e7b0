"""Job types: their handlers, retry policies and concurrency limits."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quickzones.errors import ConfigurationError, UnknownJobType
from quickzones.store.named_limits import check_cost, check_limit_name
from quickzones.store.progress import check_progress
from quickzones.store.validation import check_job_type

if TYPE_CHECKING:
    from quickzones.store.kv import KVTransaction
    from quickzones.store.records import WorkItem, ZoneId


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failing item is retried (Algorithm 3 plus backoff).

    ``inline_retries`` re-run the handler at once inside the same lease; after that the
    item is requeued with exponential backoff ``base * 2**errors`` capped at ``cap`` and
    scaled by full jitter; after ``max_attempts`` errors, or once the item is older than
    ``max_age_s``, it goes to dead letters. A lease that lapses is no error (paper
    section 5); one that lapses while the handler runs (its consumer crashed or stalled)
    counts as a lapse, and an item whose runs lapsed ``max_lapses`` times is dead-lettered
    instead of started again: one that kills its consumer every time still ends.
    """

    inline_retries: int = 0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 300.0
    max_attempts: int = 10
    max_age_s: float | None = None
    jitter: bool = True
    max_lapses: int = 3

    def backoff_s(self, error_count: int, rng: random.Random) -> float:
        delay = min(self.backoff_cap_s, self.backoff_base_s * (2 ** max(0, error_count - 1)))
        return float(delay * rng.uniform(0.5, 1.0)) if self.jitter else float(delay)

    def gives_up(self, error_count: int, age_s: float) -> bool:
        if error_count >= self.max_attempts:
            return True
        return self.max_age_s is not None and age_s >= self.max_age_s


@dataclass(slots=True)
class JobContext:
    """What a handler sees besides its payload."""

    zone: ZoneId
    item: WorkItem
    tr: KVTransaction | None = None  # set for transactional handlers
    lease_lost: Any = None  # an Event (is_set, wait) set when the lease is lost
    cancel_event: Any = None  # an Event set when the item is cancelled meanwhile
    # Where ctx.progress goes (a consumer's throttled writer); None: nowhere.
    progress_to: Callable[[float, str | None], None] | None = None
    # Metadata a failed run leaves for the runs after it: merged into the item's by the
    # retry's own write (a run that raised and is requeued), so it costs no write of its
    # own; nothing else writes it (a dead letter keeps what earlier retries merged). Keys
    # starting with "_" are quick's own: left out, with a warning (quickzones.handler_meta).
    retry_meta: dict[str, Any] = field(default_factory=dict)

    def progress(self, fraction: float, note: str | None = None) -> None:
        """Report how far this item is, from 0 to 1, with an optional short note (at most
        500 characters): ``Quick.status`` shows it while the item runs and keeps it with
        the status record after it finishes. Cheap to call often: at most one store write
        per item each 0.5 s, the last report always kept. A bad value raises
        ``InvalidArgument``."""
        if self.progress_to is None:
            check_progress(fraction, note)
            return
        self.progress_to(fraction, note)

    @property
    def app(self) -> str:
        return self.zone.app

    @property
    def tenant(self) -> str:
        return self.zone.tenant

    @property
    def item_id(self) -> str:
        return self.item.item_id

    @property
    def meta(self) -> dict[str, Any]:
        """The item's metadata as set by nacks; quick's own keys (``_``-prefixed) hidden."""
        return {k: v for k, v in self.item.meta.items() if not k.startswith("_")}

    @property
    def cancelled(self) -> bool:
        """True once the item was cancelled (``Quick.cancel``) while this handler runs,
        seen within about a second: stop early if you can; nothing is completed."""
        return self.cancel_event is not None and self.cancel_event.is_set()

    @property
    def attempt(self) -> int:
        """This run's number: the runs started so far, this one included (a lease that
        lapsed before its run started is none; inline retries share their run's)."""
        return max(1, self.item.attempts)


Handler = Callable[..., Any]


@dataclass(slots=True)
class JobType:
    """A registered job type."""

    name: str
    handler: Handler
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_concurrency: int | None = None  # per consumer
    pool_max_concurrency: int | None = None  # across every consumer of the store
    execution_bound_s: float | None = None
    transactional: bool = False
    delivery: str = "at_least_once"
    ttl_s: float | None = None
    # Named limits (quickzones.store.named_limits) a run takes ``cost`` slots of each of.
    limits: tuple[str, ...] = ()
    cost: int = 1

    def call(self, ctx: JobContext) -> Any:
        item = ctx.item
        payload: Any = json.loads(item.payload) if item.content_type == "json" else item.payload
        return self.handler(payload, ctx)


def check_limit_refs(job_type: JobType) -> None:
    """A job type's named limits: a list of distinct limit names, and a cost of each."""
    names = job_type.limits
    if isinstance(names, str) or not isinstance(names, list | tuple):
        raise ConfigurationError(
            f"job type {job_type.name!r}: limits must be a list of limit names, not {names!r}"
        )
    job_type.limits = tuple(check_limit_name(n) for n in names)
    if len(set(job_type.limits)) != len(job_type.limits):
        raise ConfigurationError(f"job type {job_type.name!r}: a limit is named twice")
    check_cost(job_type.cost)
    if job_type.cost != 1 and not job_type.limits:
        raise ConfigurationError(
            f"job type {job_type.name!r}: cost {job_type.cost} without limits counts nothing"
        )


class Registry:
    """Handlers by job type name."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}

    def register(self, job_type: JobType) -> JobType:
        check_job_type(job_type.name)
        if job_type.delivery not in ("at_least_once", "at_most_once"):
            raise ConfigurationError(f"unknown delivery {job_type.delivery!r}")
        if job_type.transactional and job_type.delivery == "at_most_once":
            raise ConfigurationError("a transactional handler is already exactly-once")
        for cap in (job_type.max_concurrency, job_type.pool_max_concurrency):
            if cap is not None and cap < 1:
                raise ConfigurationError("concurrency caps must be at least 1")
        check_limit_refs(job_type)
        self._types[job_type.name] = job_type
        return job_type

    def get(self, name: str) -> JobType:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobType(name) from None

    def find(self, name: str) -> JobType | None:
        return self._types.get(name)

    def names(self) -> list[str]:
        return sorted(self._types)

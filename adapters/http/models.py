"""The JSON shapes of the HTTP API (pydantic v2); the OpenAPI document is built from them.

Payloads travel as JSON: ``payload`` holds a JSON value, or ``payload_b64`` holds bytes
in base64 (exactly one of them). An item stored as bytes comes back as ``payload_b64``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from quickzones.adapters.http.bulk import MAX_BATCH_ITEMS
from quickzones.handler_meta import RESERVED_PREFIX, check_handler_meta
from quickzones.store.records import DeadLetter, WorkItem, ZoneId
from quickzones.store.validation import MAX_DELAY_S, MAX_PRIORITY, MIN_PRIORITY

_JOB_TYPE = r"^[A-Za-z_][A-Za-z0-9_.:\-]*$"
_Seconds = Field(default=0.0, ge=0.0, le=MAX_DELAY_S, allow_inf_nan=False)
_LeaseSeconds = Field(default=30.0, gt=0.0, le=12 * 3600.0, allow_inf_nan=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Payload(_Strict):
    payload: Any = None
    payload_b64: str | None = Field(default=None, description="bytes payload, base64")

    def body(self) -> Any:
        """The payload to enqueue: bytes from ``payload_b64``, else the JSON value."""
        if self.payload_b64 is None:
            return self.payload
        try:
            return base64.b64decode(self.payload_b64, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError(f"payload_b64 is not base64: {err}") from None

    @model_validator(mode="after")
    def _one_payload(self) -> _Payload:
        if self.payload_b64 is not None and self.payload is not None:
            raise ValueError("give payload or payload_b64, not both")
        return self


# When to run, instead of delay_s: an ISO 8601 time with its offset ("Z" or "+01:00"); a
# time without one names no instant and is refused.
_RunAt = Field(default=None, description="ISO 8601 time with offset; instead of delay_s")


class DebounceSpec(_Strict):
    key: str
    wait_s: float
    max_wait_s: float


class EnqueueRequest(_Payload):
    job_type: str = Field(min_length=1, max_length=200, pattern=_JOB_TYPE)
    delay_s: float = _Seconds
    run_at: AwareDatetime | None = _RunAt
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    item_id: str | None = Field(default=None, description="caller-chosen id: idempotent")
    ttl_s: float | None = Field(default=None, gt=0.0, le=MAX_DELAY_S, allow_inf_nan=False)
    # Checked by the enqueue itself, so a bad value is a 400 naming the field
    # (docs/flow-control.md).
    idempotency_key: str | None = Field(
        default=None, description="while its item is queued or running, a repeat stores nothing"
    )
    idempotency_ttl_s: float | None = Field(
        default=None, description="the key stays held this long after its item finished"
    )
    debounce: DebounceSpec | None = Field(
        default=None, description="keep one item per key, with the newest payload"
    )
    one_at_a_time: str | None = Field(
        default=None, description="the key's items run one at a time, in enqueue order"
    )


class BatchItem(_Payload):
    pass


class EnqueueManyRequest(_Strict):
    job_type: str = Field(min_length=1, max_length=200, pattern=_JOB_TYPE)
    items: list[BatchItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)
    delay_s: float = _Seconds
    run_at: AwareDatetime | None = _RunAt
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)


class Enqueued(BaseModel):
    item_id: str
    duplicate: str | None = Field(
        default=None,
        description='"queued" or a finished state when the id or idempotency key was known;'
        ' "debounced" when merged into the debounce key\'s queued item',
    )


class EnqueuedMany(BaseModel):
    item_ids: list[str]


class ItemState(BaseModel):
    app: str
    tenant: str
    item_id: str
    state: str
    at_ms: int
    attempts: int
    error_count: int
    next_vesting_ms: int | None = None
    last_error: str | None = None
    has_result: bool = False
    progress: float | None = None  # the handler's last ctx.progress, 0..1
    progress_note: str | None = None


class ItemResult(BaseModel):
    """A completed item's kept result: ``result`` (JSON) or ``result_b64`` (bytes)."""

    app: str
    tenant: str
    item_id: str
    result: Any = None
    result_b64: str | None = None


class NamedLimitRefs(_Strict):
    """A job type's named limits and cost (``@q.job(..., limits=[...], cost=n)``)."""

    limits: list[str] = Field(min_length=1, max_length=100)
    cost: int = Field(default=1, ge=1, le=1_000_000)


class LeaseRequest(_Strict):
    app: str | None = Field(default=None, description="default: the token's app")
    max_items: int = Field(default=1, ge=1, le=1000)
    wait_s: float = Field(default=0.0, ge=0.0, le=20.0, allow_inf_nan=False)
    lease_s: float = _LeaseSeconds
    job_types: list[str] | None = Field(default=None, max_length=100)
    fill_s: float | None = Field(
        default=None,
        ge=0.0,
        le=20.0,
        allow_inf_nan=False,
        description="once the lease holds items, visit no more zones this long after its "
        "scan began (fewer items, handed out sooner); default: fill up to max_items",
    )
    pool_caps: dict[str, Annotated[int, Field(ge=1, le=1_000_000)]] | None = Field(
        default=None,
        max_length=100,
        description="job type -> its pool_max_concurrency, as the caller's handlers declare "
        "it: a leased item of a capped type holds one of the type's pool-wide slots until "
        "it ends; one leased while they are all held is given back unstarted",
    )
    named_limits: dict[str, NamedLimitRefs] | None = Field(
        default=None,
        max_length=100,
        description="job type -> the named limits it takes and its cost, as the caller's "
        "handlers declare them: a leased item holds cost slots of each until it ends; one "
        "leased while a limit is full is given back unstarted, no attempt counted",
    )


class LeasedItem(BaseModel):
    app: str
    tenant: str
    item_id: str
    lease_id: str
    job_type: str
    payload: Any = None
    payload_b64: str | None = None
    priority: int
    attempts: int
    error_count: int
    last_error: str | None = None
    enqueued_ms: int
    lease_expires_ms: int
    # When it vested (its requested run time, a retry's backoff end): pickup is counted
    # from it, not from the enqueue (a delay is asked for, not waited). None: unknown.
    vested_ms: int | None = None
    # What earlier failed runs left for this one (nacks' ``meta``): the handler's
    # ``ctx.meta``; quick's own keys are not sent.
    meta: dict[str, Any] = Field(default_factory=dict)


class LeaseResponse(BaseModel):
    items: list[LeasedItem]


class LeaseRef(_Strict):
    lease_id: str = Field(min_length=1, max_length=200)


class _Result(_Strict):
    """A handler's return value sent with its completion: kept when the job type's
    ``keep_result_s`` asks (``result``: a JSON value; ``result_b64``: bytes, base64)."""

    result: Any = Field(default=None, description="the handler's return value (JSON)")
    result_b64: str | None = Field(default=None, description="a bytes return value, base64")

    def value(self) -> Any:
        if self.result_b64 is None:
            return self.result
        try:
            return base64.b64decode(self.result_b64, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ValueError(f"result_b64 is not base64: {err}") from None

    @model_validator(mode="after")
    def _one_result(self) -> _Result:
        if self.result_b64 is not None and self.result is not None:
            raise ValueError("give result or result_b64, not both")
        return self


class CompleteRequest(_Result):
    lease_id: str = Field(min_length=1, max_length=200)


class ProgressReport(LeaseRef):
    fraction: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    note: str | None = Field(default=None, max_length=500)


class Completion(CompleteRequest):
    app: str = Field(min_length=1, max_length=200)
    tenant: str = Field(min_length=1, max_length=200)
    item_id: str = Field(min_length=1, max_length=200)


class CompleteManyRequest(_Strict):
    items: list[Completion] = Field(min_length=1, max_length=1000)


Outcome = Literal["completed", "lease_lost", "item_gone", "corrupt"]


class CompletionOutcome(BaseModel):
    app: str
    tenant: str
    item_id: str
    outcome: Outcome = Field(
        description="completed; lease_lost: another consumer holds the item now; "
        "item_gone: it was completed, cancelled or dead-lettered meanwhile; corrupt: its "
        "stored record is unreadable (left for the consumers' corrupt-record handling)"
    )


class CompletedMany(BaseModel):
    results: list[CompletionOutcome] = Field(description="one per item, in request order")


class ExtendRequest(LeaseRef):
    lease_s: float = _LeaseSeconds


class Extended(BaseModel):
    lease_expires_ms: int


# A nack's ``meta`` (a remote handler's ``retry_meta``) is merged into the item's record,
# which every later lease and requeue rewrites: kept well inside one value (FoundationDB's
# limit is 100 kB) beside the item's own fields.
MAX_RETRY_META_BYTES = 16 * 1024


class NackRequest(LeaseRef):
    delay_s: float = _Seconds
    error: str | None = Field(default=None, max_length=2000)
    # False: the item is given back unstarted (a worker stopping, a cap), so this lease
    # was no run and its count is taken back.
    ran: bool = True
    # What the failed run leaves for the next (JobContext.retry_meta): merged into the
    # item's metadata by this requeue, seen by the next run in ``ctx.meta``.
    meta: Any = Field(default=None, description="a JSON object of the handler's own keys")

    @field_validator("meta")
    @classmethod
    def _meta(cls, meta: Any) -> Any:
        if meta is None:
            return None
        if not isinstance(meta, dict):
            raise ValueError(f"must be a JSON object, not {type(meta).__name__}")
        check_handler_meta(meta)
        size = len(json.dumps(meta, separators=(",", ":")).encode())
        if size > MAX_RETRY_META_BYTES:
            raise ValueError(f"must be at most {MAX_RETRY_META_BYTES} bytes as JSON, not {size}")
        return meta


class FailRequest(LeaseRef):
    reason: str = Field(default="failed by a remote worker", max_length=2000)
    traceback: str | None = Field(default=None, max_length=64_000)


class Problem(BaseModel):
    """Every error: a stable code, a sentence, and fields naming what it is about."""

    error: str
    detail: str
    item_id: str | None = None


class ZoneDepth(BaseModel):
    tenant: str
    items: int
    leased: bool
    pointer_vesting_ms: int | None = None


class ZonesPage(BaseModel):
    """One page of an app's active zones; no total (counting would read every zone)."""

    app: str
    zones: list[ZoneDepth]
    next_cursor: str | None = None  # the next page's cursor; null: the last page


class PauseTarget(_Strict):
    """What to pause in the route's app: the whole app (neither), one tenant, one job
    type, or one job type of one tenant."""

    tenant: str | None = None
    job_type: str | None = None


class PauseOut(BaseModel):
    app: str | None  # None: the job type is paused in every app
    tenant: str | None
    job_type: str | None
    since_ms: int


class Pauses(BaseModel):
    """One page of the pauses that hold back some of an app."""

    app: str
    pauses: list[PauseOut]
    next_cursor: str | None = None  # the next page's cursor; null: the last page


class StatsExact(BaseModel):
    """Which of an app's figures are whole counts. False: ``items`` (with ``vested``,
    ``leased``, ``by_job_type``, ``by_tenant``) counts only the items in the first
    ``scan_limit`` keys of the app's zones, ``active_zones`` only the first 1,000, and
    ``dead_letters`` only the letters counted so far (a store written before the counter
    existed: the server counts them once, online, from its start)."""

    items: bool
    active_zones: bool
    dead_letters: bool


class AppStats(BaseModel):
    app: str
    items: int  # at least this many (all of them when exact.items)
    vested: int
    leased: int
    active_zones: int  # at least this many (all of them when exact.active_zones)
    dead_letters: int  # a counter kept with the letters (exact once counted)
    by_job_type: dict[str, int]
    by_tenant: dict[str, int]
    paused: list[PauseOut] = []  # the first 100 pauses that hold back some of this app
    # More of them: GET /v1/apps/{app}/pauses?cursor= this (None: that was all).
    paused_next_cursor: str | None = None
    exact: StatsExact
    scan_limit: int  # keys of the app's zones the item figures read at most


class ZoneItem(BaseModel):
    item_id: str
    job_type: str
    state: Literal["queued", "vested", "leased"]
    priority: int
    attempts: int
    error_count: int
    vesting_ms: int
    enqueued_ms: int
    last_error: str | None = None


class ZoneItems(BaseModel):
    app: str
    tenant: str
    total: int  # the zone's item count: a counter kept with the items, not a scan
    items: list[ZoneItem]
    next_cursor: str | None = None  # the next page's cursor; null: the last page


class DeadLetterOut(BaseModel):
    app: str
    tenant: str
    item_id: str
    job_type: str | None
    reason: str
    dead_at_ms: int
    error_count: int | None
    traceback: str | None = None


class DeadLettersPage(BaseModel):
    """One page; no total (counting would read every letter): follow ``next_cursor``
    until it is null."""

    dead_letters: list[DeadLetterOut]
    next_cursor: str | None = None


class DeadLetterFilter(_Strict):
    tenant: str | None = Field(default=None, max_length=200)
    job_type: str | None = Field(default=None, max_length=200)
    item_id: str | None = Field(default=None, max_length=200)


class DeadLetterSelection(DeadLetterFilter):
    """The dead letters a bulk requeue or purge acts on: the filters, and at most
    ``limit`` of them."""

    limit: int | None = Field(default=None, ge=1)


class Count(BaseModel):
    count: int
    skipped: int = 0


class ShardPointers(BaseModel):
    shard: int
    pointers: int  # of the first 1,000 pointer records read (all of them when exact)
    vested: int
    leased: int
    exact: bool  # false: the shard has more pointers than were read; these are at least


class Shards(BaseModel):
    cluster: str
    shards: list[ShardPointers]


def leased_item(zone: ZoneId, item: WorkItem) -> LeasedItem:
    payload, b64 = payload_out(item)
    return LeasedItem(
        app=zone.app,
        tenant=zone.tenant,
        item_id=item.item_id,
        lease_id=item.lease_id or "",
        job_type=item.job_type,
        payload=payload,
        payload_b64=b64,
        priority=item.priority,
        attempts=item.attempts,
        error_count=item.error_count,
        last_error=item.last_error,
        enqueued_ms=item.enqueued_ms,
        lease_expires_ms=item.vesting_ms,
        vested_ms=item.vested_ms,
        meta=_json_meta(item.meta),
    )


def _json_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The handler's metadata a lease carries: quick's own ``_`` keys left out, and any
    value JSON cannot carry (bytes a local handler's nack left) too, so that one never
    fails the lease."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key.startswith(RESERVED_PREFIX):
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def payload_out(item: WorkItem) -> tuple[Any, str | None]:
    import json

    if item.content_type == "json":
        return json.loads(item.payload), None
    return None, base64.b64encode(item.payload).decode("ascii")


def dead_letter_out(letter: DeadLetter) -> DeadLetterOut:
    item = letter.item
    return DeadLetterOut(
        app=letter.zone.app,
        tenant=letter.zone.tenant,
        item_id=letter.item_id,
        job_type=None if item is None else item.job_type,
        reason=letter.reason,
        dead_at_ms=letter.dead_at_ms,
        error_count=None if item is None else item.error_count,
        traceback=letter.traceback,
    )

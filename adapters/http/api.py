"""The versioned JSON API, ``/v1``: producers, pull consumers and admin.

Every route but ``/v1/health`` needs a bearer token (:mod:`quickzones.adapters.http.tokens`) with
the route's role, for the app the route names: no token or an unknown one is 401, a token
without the role or for another app is 403. Errors are :class:`~.models.Problem` bodies
with a stable ``error`` code. Routes are plain functions: FastAPI runs them in its thread
pool, and each store call is a short transaction of its own.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from quickzones.adapters.http import bulk, views
from quickzones.adapters.http import models as m
from quickzones.adapters.http import paths as _paths  # noqa: F401  (registers {name:seg})
from quickzones.adapters.http.polls import RETRY_AFTER_S, PollLimits, TooManyPolls
from quickzones.adapters.http.tokens import ALL_APPS, TokenInfo, TokenStore
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.consumer.pull_leaser import Leased, LimitRefs, PullLeaser
from quickzones.consumer.settler import Completion, NotCommitted, Settler
from quickzones.errors import (
    InvalidArgument,
    ItemNotFound,
    LeaseLost,
    QuickError,
    RetryLimitExceeded,
    StoreBusy,
    TransactionTooLong,
)
from quickzones.store import admin
from quickzones.store.flow_keys import Debounce
from quickzones.store.outcomes import JobStatus, ResultNotAvailable
from quickzones.store.progress import ProgressStore
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_job_type, check_name

log = logging.getLogger("quick.serve")


class ApiError(Exception):
    """An HTTP error with a Problem body."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        item_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.item_id = item_id
        self.headers = headers


@dataclass(slots=True)
class ServeState:
    """What the routes share: the store, its tokens, the pull leaser, and shutdown."""

    q: Quick
    tokens: TokenStore
    leaser: PullLeaser
    stopping: threading.Event
    polls: PollLimits
    batches: bulk.BatchTurns = field(default_factory=bulk.BatchTurns)


_bearer = HTTPBearer(auto_error=False, description="A token from `quick tokens create` (qz_...).")
_Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def state_of(request: Request) -> ServeState:
    state: ServeState = request.app.state.quick
    return state


async def authenticate(request: Request, creds: HTTPAuthorizationCredentials | None) -> TokenInfo:
    """The caller's token: from the token cache on the event loop, else checked against
    the store on a worker thread."""
    if creds is None:
        raise ApiError(401, "unauthenticated", "send Authorization: Bearer <token>")
    tokens = state_of(request).tokens
    info = tokens.cached(creds.credentials)
    if info is None:
        info = await anyio.to_thread.run_sync(tokens.check, creds.credentials)
    if info is None:
        raise ApiError(401, "invalid_token", "the token is unknown or was revoked")
    return info


class Role:
    """A dependency: the caller's token, which must have ``role``."""

    def __init__(self, role: str) -> None:
        self.role = role

    async def __call__(self, request: Request, creds: _Creds) -> TokenInfo:
        # A coroutine, so a cached token costs the request no trip to the thread pool.
        info = await authenticate(request, creds)
        if not info.has_role(self.role):
            raise ApiError(403, "forbidden_role", f"this token lacks the {self.role!r} role")
        return info


def allow_app(info: TokenInfo, app: str) -> str:
    if not info.allows_app(app):
        raise ApiError(403, "forbidden_app", f"this token is for app {info.app!r}, not {app!r}")
    return app


def cleared(found: bool, code: str, detail: str) -> Response:
    """The answer of a DELETE of a setting named exactly so (a weight, a tenant limit, a
    pause): 204 when it was stored and is gone, else the 404 ``code`` that names it."""
    if not found:
        raise ApiError(404, code, detail)
    return Response(status_code=204)


Producer = Annotated[TokenInfo, Depends(Role("produce"))]
Consumer = Annotated[TokenInfo, Depends(Role("consume"))]
Admin = Annotated[TokenInfo, Depends(Role("admin"))]

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"model": m.Problem} for code in (400, 401, 403, 404, 409, 413)
}

router = APIRouter(prefix="/v1", responses=_PROBLEMS)
# Names in paths are {name:seg}: a "/" or "%" in one arrives whole (paths.PathSegments).
_ITEM = "/apps/{app:seg}/tenants/{tenant:seg}/items/{item_id:seg}"


@router.get("/health", tags=["meta"])
async def health() -> dict[str, str]:
    # A coroutine: it answers from the event loop even while every thread is busy.
    return {"status": "ok"}


# --- producers -------------------------------------------------------------------------


@router.post("/apps/{app:seg}/tenants/{tenant:seg}/items", status_code=201, tags=["produce"])
def enqueue(
    app: str,
    tenant: str,
    body: m.EnqueueRequest,
    request: Request,
    who: Producer,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> m.Enqueued:
    """Enqueue one item into the zone (app, tenant). The ``Idempotency-Key`` header is
    the body's ``idempotency_key`` (docs/flow-control.md)."""
    q = state_of(request).q
    key = body.idempotency_key
    if idempotency_key is not None:
        if key is not None and key != idempotency_key:
            raise InvalidArgument("idempotency_key", key, "differs from the Idempotency-Key header")
        key = idempotency_key
    d = body.debounce
    item_id = q.enqueue(
        body.job_type,
        _body(body),
        app=allow_app(who, app),
        tenant=tenant,
        delay=body.delay_s,
        run_at=body.run_at,
        priority=body.priority,
        item_id=body.item_id,
        ttl=body.ttl_s,
        idempotency_key=key,
        idempotency_ttl_s=body.idempotency_ttl_s,
        debounce=None if d is None else Debounce(d.key, d.wait_s, d.max_wait_s),
        one_at_a_time=body.one_at_a_time,
    )
    return m.Enqueued(item_id=str(item_id), duplicate=getattr(item_id, "duplicate", None))


@router.post(
    "/apps/{app:seg}/tenants/{tenant:seg}/batches",
    status_code=201,
    tags=["produce"],
    responses={503: {"model": m.Problem, "description": "not written: send it again later"}},
)
def enqueue_many(
    app: str, tenant: str, body: m.EnqueueManyRequest, request: Request, who: Producer
) -> m.EnqueuedMany:
    """Enqueue several items (at most 10,000) into one zone in one transaction: all or
    none. Batches take turns (:mod:`~quickzones.adapters.http.bulk`); 503 with
    ``Retry-After``: nothing was written, send it again then, or in smaller batches."""
    state = state_of(request)
    allow_app(who, app)
    payloads = [_body(item) for item in body.items]
    later = {"Retry-After": str(bulk.RETRY_AFTER_S)}
    with state.batches.turn(len(payloads)) as admitted:
        if not admitted:
            raise ApiError(
                503,
                "busy",
                f"other batches kept this server writing for {state.batches.wait_s:g} s; "
                f"nothing was written: send it again after {bulk.RETRY_AFTER_S} s",
                headers=later,
            )
        try:
            ids = state.q.enqueue_many(
                body.job_type,
                payloads,
                app=app,
                tenant=tenant,
                delay=body.delay_s,
                run_at=body.run_at,
                priority=body.priority,
            )
        except (TransactionTooLong, StoreBusy, RetryLimitExceeded) as err:
            if getattr(err, "maybe_committed", False):
                raise  # its last commit's outcome is unknown: a 503 storage_error says so
            raise ApiError(
                503,
                "batch_not_written",
                f"{err}; nothing was written: send it again after {bulk.RETRY_AFTER_S} s, "
                "or in smaller batches",
                headers=later,
            ) from err
    return m.EnqueuedMany(item_ids=[str(i) for i in ids])


@router.get(_ITEM, tags=["produce"])
def item_state(app: str, tenant: str, item_id: str, request: Request, who: Producer) -> m.ItemState:
    """What became of an item: queued, leased, completed, cancelled or dead_lettered."""
    q = state_of(request).q
    allow_app(who, app)
    status: JobStatus | None
    if q.capabilities.outcome_records:
        status = q.status(app, tenant, item_id)
    else:
        item = q.get(app, tenant, item_id)
        status = None if item is None else q.status(app, tenant, item_id)
    if status is None:
        raise ApiError(404, "item_not_found", f"no item {item_id!r} in {app}/{tenant}", item_id)
    return m.ItemState(
        app=app,
        tenant=tenant,
        item_id=item_id,
        state=status.state,
        at_ms=status.at_ms,
        attempts=status.attempts,
        error_count=status.error_count,
        next_vesting_ms=status.next_vesting_ms,
        last_error=status.last_error,
        has_result=status.has_result,
        progress=status.progress,
        progress_note=status.progress_note,
    )


@router.get(_ITEM + "/result", tags=["produce"])
def item_result(
    app: str, tenant: str, item_id: str, request: Request, who: Producer
) -> m.ItemResult:
    """A completed item's kept result (job types with ``keep_result_s``). 404
    ``result_pending``: not finished yet, ask again later; 404 ``result_not_available``:
    there is none, and ``detail`` says why."""
    q = state_of(request).q
    try:
        value = q.result(allow_app(who, app), tenant, item_id)
    except ResultNotAvailable as err:
        code = "result_pending" if err.pending else "result_not_available"
        raise ApiError(404, code, err.reason, item_id) from None
    if isinstance(value, bytes):
        encoded = base64.b64encode(value).decode("ascii")
        return m.ItemResult(app=app, tenant=tenant, item_id=item_id, result_b64=encoded)
    return m.ItemResult(app=app, tenant=tenant, item_id=item_id, result=value)


@router.delete(_ITEM, status_code=204, tags=["produce"])
def cancel(app: str, tenant: str, item_id: str, request: Request, who: Producer) -> Response:
    """Delete an item, leased or not."""
    state_of(request).q.cancel(allow_app(who, app), tenant, item_id)
    return Response(status_code=204)


def _body(payload: m._Payload) -> Any:
    try:
        return payload.body()
    except ValueError as err:
        raise ApiError(400, "invalid_payload", str(err)) from None


# --- pull consumers --------------------------------------------------------------------


def _json(body: BaseModel) -> Response:
    """``body`` as the response, serialized where it is made (FastAPI would validate a
    returned model again, on another trip to the thread pool)."""
    return Response(body.model_dump_json(), media_type="application/json")


@router.post("/leases", tags=["consume"], response_model=m.LeaseResponse)
async def lease(body: m.LeaseRequest, request: Request, who: Consumer) -> Response:
    """Lease up to ``max_items`` vested items, waiting up to ``wait_s`` for the first."""
    state = state_of(request)
    app = body.app if body.app is not None else who.app
    if app == ALL_APPS:
        if not who.all_apps:
            raise ApiError(403, "forbidden_app", f"this token is for app {who.app!r} only")
        scope = None
    else:
        scope = allow_app(who, check_name("app", app))
    types = None
    if body.job_types is not None:
        types = frozenset(check_job_type(t) for t in body.job_types)
    caps = None
    if body.pool_caps:
        caps = {check_job_type(t): n for t, n in body.pool_caps.items()}
    refs = None
    if body.named_limits:
        refs = {
            check_job_type(t): LimitRefs.of(t, x.limits, x.cost)
            for t, x in body.named_limits.items()
        }

    try:
        with contextlib.ExitStack() as held:
            if body.wait_s > 0:
                held.enter_context(state.polls.admit(who.token_id))
            # Waits on the event loop between scans: an open poll holds no thread.
            got = await state.leaser.lease_async(
                state.leaser.poll(
                    scope,
                    body.max_items,
                    body.lease_s,
                    body.wait_s,
                    types,
                    state.stopping,
                    body.fill_s,
                    pool_caps=caps,
                    named_limits=refs,
                )
            )
    except TooManyPolls as err:
        raise ApiError(
            429, "too_many_polls", err.detail, headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    if not got:
        return Response('{"items":[]}', media_type="application/json")

    def encoded() -> Response:
        leaser = state.leaser
        sent = (_deliverable(leaser.settler, leaser.cluster.name, x) for x in got)
        items = [one for one in sent if one is not None]
        return Response('{"items":[' + ",".join(items) + "]}", media_type="application/json")

    return await anyio.to_thread.run_sync(encoded)


def _deliverable(settler: Settler, cluster: str, x: Leased) -> str | None:
    """A leased item as the response's JSON, or None when it cannot be sent (a payload
    stored before enqueue refused what the API cannot encode, or an unreadable one): the
    item is dead-lettered with the reason, so it neither breaks the response for the
    others nor comes back to break the next one."""
    try:
        return m.leased_item(x.zone, x.item).model_dump_json()
    except (ValueError, RecursionError) as err:
        reason = f"its payload cannot be sent by the HTTP API: {type(err).__name__}: {err}"
    log.warning("item %s of %s dead-lettered: %s", x.item.item_id, x.zone, reason)
    with contextlib.suppress(LeaseLost, ItemNotFound):
        settler.dead_letter(
            cluster, x.zone, x.item.item_id, x.item.lease_id, reason[:2000], ran=False
        )
    return None


def _lost(q: Quick, zone: ZoneId, item_id: str, err: Exception) -> ApiError:
    """The 409 for a settle whose lease is lost, saying what happened: from the zone
    store's LeaseLost, or, for an item no longer there, from its outcome record or dead
    letter where the store keeps one."""
    if isinstance(err, LeaseLost):
        return ApiError(409, "lease_lost", err.reason, item_id)
    what = "it was completed, cancelled or dead-lettered (no record of which is kept)"
    with contextlib.suppress(QuickError):
        status = q.status(zone.app, zone.tenant, item_id)
        if status is not None and status.state in _FINISHED:
            what = f"it was {_FINISHED[status.state]}"
    return ApiError(409, "item_gone", f"the item is gone: {what}", item_id)


_FINISHED = {"completed": "completed", "cancelled": "cancelled", "dead_lettered": "dead-lettered"}


@router.post(_ITEM + "/complete", status_code=204, tags=["consume"])
def complete(
    app: str, tenant: str, item_id: str, body: m.CompleteRequest, request: Request, who: Consumer
) -> Response:
    """Delete a leased item: the work is done (only the lease holder). ``result`` or
    ``result_b64``: the handler's return value, kept as its job type's ``keep_result_s``
    says."""
    state = state_of(request)
    q = state.q
    zone = q.zone(allow_app(who, app), tenant)
    result = _result(body)
    leaser = state.leaser
    try:
        leaser.settler.complete(
            leaser.cluster.name, zone, check_name("item_id", item_id), body.lease_id, result
        )
    except (LeaseLost, ItemNotFound) as err:
        raise _lost(q, zone, item_id, err) from None
    return Response(status_code=204)


def _result(body: m.CompleteRequest) -> Any:
    """The handler's return value sent with a completion (None: none sent)."""
    try:
        return body.value()
    except ValueError as err:
        raise ApiError(400, "invalid_result", str(err)) from None


@router.post("/completions", tags=["consume"], response_model=m.CompletedMany)
def complete_many(body: m.CompleteManyRequest, request: Request, who: Consumer) -> Response:
    """Complete several leased items in one request, with one commit per zone: each
    item's outcome is reported (``lease_lost``, ``item_gone``), none fails the rest. The
    token must allow every item's app; an item given twice is refused (400)."""
    state = state_of(request)
    q = state.q
    seen: set[tuple[str, str, str]] = set()
    completions = []
    for n, c in enumerate(body.items):
        zone = q.zone(allow_app(who, c.app), c.tenant)
        key = (c.app, c.tenant, check_name("item_id", c.item_id))
        if key in seen:
            raise ApiError(
                400,
                "duplicate_item",
                f"item {c.item_id!r} of {c.app}/{c.tenant} is given twice (items[{n}])",
                c.item_id,
            )
        seen.add(key)
        completions.append(Completion(zone, c.item_id, c.lease_id, _result(c)))
    # One settler call: the zones' items in one commit per zone (or per store, where the
    # zone store merges zones), as a local consumer's batched completions.
    leaser = state.leaser
    done = leaser.settler.complete_many(leaser.cluster.name, completions)
    outcomes: list[m.Outcome] = []
    for err in done:
        if isinstance(err, NotCommitted):
            raise err.cause  # the store's answer, as any route's
        if isinstance(err, LeaseLost):
            outcomes.append("lease_lost")
        elif isinstance(err, ItemNotFound):
            outcomes.append("item_gone")
        else:
            outcomes.append("corrupt" if err is not None else "completed")
    return _json(
        m.CompletedMany(
            results=[
                m.CompletionOutcome(app=c.app, tenant=c.tenant, item_id=c.item_id, outcome=o)
                for c, o in zip(body.items, outcomes, strict=True)
            ]
        )
    )


@router.post(_ITEM + "/extend", tags=["consume"])
def extend(
    app: str, tenant: str, item_id: str, body: m.ExtendRequest, request: Request, who: Consumer
) -> m.Extended:
    """Keep holding a lease for ``lease_s`` more seconds from now."""
    state = state_of(request)
    q = state.q
    zone = q.zone(allow_app(who, app), tenant)
    try:
        item = q.items.extend_lease(
            zone, check_name("item_id", item_id), body.lease_id, int(body.lease_s * 1000)
        )
    except (LeaseLost, ItemNotFound) as err:
        raise _lost(q, zone, item_id, err) from None
    state.leaser.held_slots.extended(zone, item_id, item.vesting_ms)
    state.leaser.pull_runs.extended(zone, item_id, item.vesting_ms)
    return m.Extended(lease_expires_ms=item.vesting_ms)


@router.post(_ITEM + "/progress", status_code=204, tags=["consume"])
def progress(
    app: str, tenant: str, item_id: str, body: m.ProgressReport, request: Request, who: Consumer
) -> Response:
    """Keep the running handler's progress with the item (only the lease holder); the
    status route shows it, and after completion the status record keeps it."""
    q = state_of(request).q
    zone = q.zone(allow_app(who, app), tenant)
    if isinstance(q.items, ProgressStore):
        try:
            q.items.record_progress(
                zone, check_name("item_id", item_id), body.lease_id, body.fraction, body.note
            )
        except (LeaseLost, ItemNotFound) as err:
            raise _lost(q, zone, item_id, err) from None
    return Response(status_code=204)


@router.post(_ITEM + "/nack", status_code=204, tags=["consume"])
def nack(
    app: str, tenant: str, item_id: str, body: m.NackRequest, request: Request, who: Consumer
) -> Response:
    """Give the item back to run again after ``delay_s``; with ``error``, the failed run
    counts as an error; ``meta`` (a JSON object, at most 16 KiB) is merged into the
    item's metadata: what the run leaves for the next (``JobContext.retry_meta``)."""
    state = state_of(request)
    q = state.q
    zone = q.zone(allow_app(who, app), tenant)
    leaser = state.leaser
    try:
        leaser.settler.requeue(
            leaser.cluster.name,
            zone,
            check_name("item_id", item_id),
            body.lease_id,
            int(body.delay_s * 1000),
            error=body.error,
            count_error=body.error is not None,
            meta=body.meta,
            ran=body.ran,
        )
    except (LeaseLost, ItemNotFound) as err:
        raise _lost(q, zone, item_id, err) from None
    return Response(status_code=204)


@router.post(_ITEM + "/fail", status_code=204, tags=["consume"])
def fail(
    app: str, tenant: str, item_id: str, body: m.FailRequest, request: Request, who: Consumer
) -> Response:
    """Fail permanently: the item moves to the dead letters with the reason and traceback."""
    state = state_of(request)
    q = state.q
    zone = q.zone(allow_app(who, app), tenant)
    leaser = state.leaser
    try:
        leaser.settler.dead_letter(
            leaser.cluster.name,
            zone,
            check_name("item_id", item_id),
            body.lease_id,
            body.reason,
            body.traceback,
        )
    except (LeaseLost, ItemNotFound) as err:
        raise _lost(q, zone, item_id, err) from None
    return Response(status_code=204)


# --- admin -----------------------------------------------------------------------------

# A page's size (every paged list: 50 unless asked, at most 1,000).
PageLimit = Annotated[int, Query(ge=1, le=1000)]
# A page's cursor: the ``next_cursor`` of the page before (opaque; made by the server).
PageCursor = Annotated[str | None, Query(max_length=4096)]


@router.get("/apps/{app:seg}/stats", tags=["admin"])
def app_stats(app: str, request: Request, who: Admin) -> m.AppStats:
    """One app's dead letters (exact: a counter kept with them) and, from a bounded scan,
    its items by state, job type and tenant (the 100 deepest tenants) and active zones;
    ``exact`` says which figures are whole counts and which count only what the scan read
    (at most ``scan_limit`` keys of the app's items): a request costs the same however
    many tenants, items or dead letters the app has."""
    q = state_of(request).q
    check_name("app", allow_app(who, app))
    figures = views.app_figures(q, app)
    zones, zones_exact = views.active_zone_count(q, app)
    dead = views.dead_letter_total(q, app)
    paused = q.pause_page(app, limit=PAUSES_SHOWN)  # the first ones: a page, not them all
    return m.AppStats(
        app=app,
        items=figures.items,
        vested=figures.vested,
        leased=figures.leased,
        active_zones=zones,
        dead_letters=dead.count,
        by_job_type=dict(figures.by_job_type),
        by_tenant=dict(figures.by_tenant.most_common(100)),
        paused=[
            m.PauseOut(app=p.app, tenant=p.tenant, job_type=p.job_type, since_ms=p.since_ms)
            for p in paused.rows  # its own and every app's, no other's
        ],
        paused_next_cursor=paused.next_cursor,
        exact=m.StatsExact(
            items=figures.exact, active_zones=zones_exact, dead_letters=dead.exact
        ),
        scan_limit=views.SCAN_KEYS,
    )


PAUSES_SHOWN = 100  # pauses an app's stats list; the rest: /v1/apps/{app}/pauses?cursor=


@router.get("/apps/{app:seg}/zones", tags=["admin"])
def app_zones(
    app: str,
    request: Request,
    who: Admin,
    search: Annotated[str | None, Query(max_length=200)] = None,
    cursor: PageCursor = None,
    limit: PageLimit = 50,
) -> m.ZonesPage:
    """A page of an app's active zones (those with a pointer), by tenant, from ``cursor``
    (the ``next_cursor`` of the page before), searchable (tenant contains ``search``). A
    page reads what it shows (a search passes over at most 1,000 tenants per shard, then
    ends, possibly short, with a cursor to go on from); no total (it would read every
    zone)."""
    q = state_of(request).q
    check_name("app", allow_app(who, app))
    zones, next_cursor = views.zone_depth_page(q, app, search=search, limit=limit, cursor=cursor)
    return m.ZonesPage(app=app, zones=zones, next_cursor=next_cursor)


@router.get("/apps/{app:seg}/tenants/{tenant:seg}/items", tags=["admin"])
def zone_items(
    app: str,
    tenant: str,
    request: Request,
    who: Admin,
    cursor: PageCursor = None,
    limit: PageLimit = 50,
) -> m.ZoneItems:
    """A page of a zone's items in every state, in id order, from ``cursor`` (the
    ``next_cursor`` of the page before); ``total`` is the zone's item count, a counter kept
    with the items. A page reads what it shows, however many items the zone holds."""
    q = state_of(request).q
    zone = q.zone(allow_app(who, app), tenant)
    total, page = admin.zone_item_page(q, zone, limit=limit, cursor=cursor)
    now = now_ms(q.clock)
    return m.ZoneItems(
        app=app,
        tenant=tenant,
        total=total,
        next_cursor=page.next_cursor,
        items=[
            m.ZoneItem(
                item_id=i.item_id,
                job_type=i.job_type,
                state=views.item_state(i, now),  # type: ignore[arg-type]
                priority=i.priority,
                attempts=i.attempts,
                error_count=i.error_count,
                vesting_ms=i.vesting_ms,
                enqueued_ms=i.enqueued_ms,
                last_error=i.last_error,
            )
            for i in page.rows
        ],
    )


def _letters(q: Quick, app: str, f: m.DeadLetterFilter, limit: int | None = None) -> list[Any]:
    check_name("app", app)
    return views.dead_letters(
        q,
        app,
        tenant=None if f.tenant is None else check_name("tenant", f.tenant),
        job_type=f.job_type,
        item_id=None if f.item_id is None else check_name("item_id", f.item_id),
        limit=limit,
    )


@router.get("/apps/{app:seg}/dead-letters", tags=["admin"])
def list_dead_letters(
    app: str,
    request: Request,
    who: Admin,
    tenant: Annotated[str | None, Query(max_length=200)] = None,
    job_type: Annotated[str | None, Query(max_length=200)] = None,
    item_id: Annotated[str | None, Query(max_length=200)] = None,
    cursor: PageCursor = None,
    limit: PageLimit = 50,
) -> m.DeadLettersPage:
    """A page of dead letters with their reason and traceback, in (tenant, id) order,
    from ``cursor`` (the ``next_cursor`` of the page before; none: the first page); every
    filter given filters. A page reads what it shows (plus at most 1,000 letters a
    job-type filter passes over), however many letters lie behind it, so it may hold
    fewer than ``limit`` and still have a next one: the list ends where ``next_cursor``
    is null. No total is given: counting would read every letter."""
    q = state_of(request).q
    page = admin.dead_letter_page(
        q,
        check_name("app", allow_app(who, app)),
        None if tenant is None else check_name("tenant", tenant),
        job_type=job_type,
        item_id=None if item_id is None else check_name("item_id", item_id),
        limit=limit,
        cursor=cursor,
    )
    return m.DeadLettersPage(
        dead_letters=[m.dead_letter_out(x) for x in page.rows], next_cursor=page.next_cursor
    )


@router.post("/apps/{app:seg}/dead-letters/requeue", tags=["admin"])
def requeue_dead_letters(
    app: str, body: m.DeadLetterSelection, request: Request, who: Admin
) -> m.Count:
    """Put the selected dead letters (at most ``limit``) back into their zones with a clean
    error count, in bounded transactions; a letter whose id is queued again meanwhile is
    kept and counted as skipped, as is a corrupt one."""
    q = state_of(request).q
    done = admin.requeue(q, _letters(q, allow_app(who, app), body), body.limit)
    return m.Count(count=done.requeued, skipped=len(done.kept) + len(done.corrupt) + done.gone)


@router.post("/apps/{app:seg}/dead-letters/purge", tags=["admin"])
def purge_dead_letters(
    app: str, body: m.DeadLetterSelection, request: Request, who: Admin
) -> m.Count:
    """Delete the selected dead letters, at most ``limit`` (all of the app's when no filter
    is given)."""
    q = state_of(request).q
    return m.Count(count=admin.purge(q, _letters(q, allow_app(who, app), body, body.limit)))


@router.get("/shards", tags=["admin"])
def shards(request: Request, who: Admin) -> m.Shards:
    """Pointers per shard of the cluster (a token for every app only), from at most 1,000
    pointer records a shard (``exact`` false: at least these)."""
    if not who.all_apps:
        raise ApiError(403, "forbidden_app", "pointers of every app need a token for every app")
    q = state_of(request).q
    return m.Shards(
        cluster=q.toplevel.cluster,
        shards=[
            m.ShardPointers(shard=s, pointers=n, vested=v, leased=leased, exact=exact)
            for s, n, v, leased, exact in views.pointers_by_shard(q)
        ],
    )

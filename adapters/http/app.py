"""The ASGI app of ``quick serve``: the ``/v1`` JSON API, its OpenAPI document at
``/openapi.json`` (browsable at ``/docs``), and the dashboard at ``/``.

:func:`create_app` takes an open :class:`~quickzones.client.Quick`; it never opens or
closes the store itself, so a test or an embedding service owns that.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quickzones.adapters.http import cancels
from quickzones.adapters.http.api import ApiError, ServeState, router
from quickzones.adapters.http.batches_api import router as batches_router
from quickzones.adapters.http.connections import Budget
from quickzones.adapters.http.explain_api import router as explain_router
from quickzones.adapters.http.fairness_api import router as fairness_router
from quickzones.adapters.http.in_order import ServeInOrder
from quickzones.adapters.http.limits_api import router as limits_router
from quickzones.adapters.http.paths import PathSegments
from quickzones.adapters.http.pauses_api import router as pauses_router
from quickzones.adapters.http.polls import PollLimits
from quickzones.adapters.http.tokens import TokenStore
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.maintenance import HEARTBEAT_S
from quickzones.consumer.pull_leaser import PullConfig, PullLeaser
from quickzones.errors import (
    InvalidArgument,
    ItemAlreadyQueued,
    ItemNotFound,
    LeaseLost,
    PayloadTooLarge,
    QuickError,
    StorageError,
    TransactionTooLarge,
    UnknownJobType,
    UnsupportedByStore,
)
from quickzones.store import admin
from quickzones.store.outcomes import DuplicateItemMismatch

log = logging.getLogger("quick.serve")

DEFAULT_MAX_BODY = 4 * 1024 * 1024  # bytes of one request body
# How long the server admits a token it checked without reading the store again: a
# revocation by another process (``quick tokens revoke``) takes effect within this.
TOKEN_CACHE_S = 1.0


def _problem(
    status: int,
    error: str,
    detail: str,
    item_id: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"error": error, "detail": detail}
    if item_id is not None:
        body["item_id"] = item_id
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(body, status_code=status, headers=headers)


# A quick error's HTTP status and code, most specific first.
_ERRORS: list[tuple[type[Exception], int, str]] = [
    (PayloadTooLarge, 413, "payload_too_large"),
    (TransactionTooLarge, 413, "batch_too_large"),
    (InvalidArgument, 400, "invalid_argument"),
    (UnknownJobType, 400, "unknown_job_type"),
    (ItemNotFound, 404, "item_not_found"),
    (LeaseLost, 409, "lease_lost"),
    (ItemAlreadyQueued, 409, "item_already_queued"),
    (DuplicateItemMismatch, 409, "duplicate_item_mismatch"),
    (UnsupportedByStore, 400, "unsupported_by_store"),
]


# Starlette's own refusals, as the API's error codes.
_HTTP_CODES = {400: "invalid_body", 404: "not_found", 405: "method_not_allowed"}


class BodyLimit:
    """Refuses a request body larger than ``limit`` bytes with 413, whether announced by
    Content-Length or streamed in chunks, before the route reads it whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    announced = -1
                if announced < 0 or announced > self.limit:
                    await self._refuse(send)
                    return
        seen = 0
        refused = False

        async def limited() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if not refused:  # after a refusal the app's own answer is dropped
                await send(message)

        await self.app(scope, limited, guarded)

    async def _refuse(self, send: Send) -> None:
        response = _problem(
            413, "body_too_large", f"request bodies are limited to {self.limit} bytes"
        )
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(
    q: Quick,
    *,
    tokens: TokenStore | None = None,
    config: ConsumerConfig | None = None,
    pull: PullConfig | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    dashboard: bool = True,
    open_files: int | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> FastAPI:
    """The server's ASGI app over an open Quick. Its pull leases scan and visit zones
    with ``config``'s parameters (a consumer's: ``dequeue_max``, ``visit_max``,
    ``selection_frac``...); ``pull``: the long poll's own. The long polls it holds open
    are limited by the process's open-file limit (``open_files``: another's, in tests).
    Its pull leases' heartbeat record and pickup and run counts reach the store every
    ``heartbeat_s`` (shorter in tests)."""
    stopping = threading.Event()
    pull = pull or PullConfig()
    budget = Budget.of(open_files)
    # A candidate for the in-order scanner, so remote workers alone have one too.
    in_order = ServeInOrder(q, config or ConsumerConfig())
    state = ServeState(
        q=q,
        tokens=tokens or TokenStore(q.kv, q.keys, q.clock, cache_s=TOKEN_CACHE_S),
        leaser=PullLeaser(
            q, config, pull, heartbeat_s, in_order=in_order.scan_in_order, leads=in_order.holds
        ),
        stopping=stopping,
        polls=PollLimits(budget.long_polls, budget.long_polls_per_token),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        # Long polls wait on the loop and take a thread only for each scan; the routes'
        # store calls and those scans share these threads.
        anyio.to_thread.current_default_thread_limiter().total_tokens = 200
        stopping.clear()
        flusher = threading.Thread(
            target=state.leaser.beat_until, args=(stopping,), name="quick-heartbeat"
        )
        flusher.start()
        electing = threading.Thread(
            target=in_order.run_until, args=(stopping,), name="quick-in-order", daemon=True
        )
        electing.start()
        # A store written before the dead-letter counters: count its letters once, online
        # (pages show the count so far, marked not exact, until it ends).
        counting = threading.Thread(
            target=admin.count_dead_letters_online,
            args=(q, stopping.wait),
            name="quick-dead-counts",
            daemon=True,
        )
        counting.start()
        yield
        stopping.set()  # long polls return what they have
        in_order.stop()
        await anyio.to_thread.run_sync(flusher.join)
        await anyio.to_thread.run_sync(electing.join)

    app = FastAPI(
        title="quick serve",
        version="1",
        summary="QuiCK queue zones over HTTP: producers, pull consumers and admin.",
        lifespan=lifespan,
    )
    app.state.quick = state
    app.include_router(router)
    app.include_router(cancels.router)  # running items' cancels, for remote workers
    app.include_router(pauses_router)
    app.include_router(batches_router)
    app.include_router(fairness_router)  # tenant weights and limits
    app.include_router(explain_router)  # why an item has not started
    app.include_router(limits_router)  # named limits shared by job types

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return _problem(err.status, err.error, err.detail, err.item_id, err.headers)

    @app.exception_handler(QuickError)
    async def quick_error(_: Request, err: QuickError) -> JSONResponse:
        for kind, status, code in _ERRORS:
            if isinstance(err, kind):
                return _problem(status, code, str(err), getattr(err, "item_id", None))
        if isinstance(err, StorageError):
            log.warning("storage error: %s", err)
            return _problem(503, "storage_error", str(err))
        log.error("unmapped quick error", exc_info=err)
        return _problem(500, "internal", f"{type(err).__name__}: {err}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        # Unknown routes, wrong methods and bodies that do not parse: the API's shape.
        code = _HTTP_CODES.get(err.status_code, f"http_{err.status_code}")
        headers = None if err.headers is None else dict(err.headers)
        return _problem(err.status_code, code, str(err.detail), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        detail = f"{where}: {first.get('msg', 'invalid request')}"
        body = {"error": "invalid_request", "detail": detail, "errors": _plain(err.errors())}
        return JSONResponse(body, status_code=422)

    if dashboard:
        from quickzones.adapters.http.dashboard import mount_dashboard

        mount_dashboard(app, state)

    app.add_middleware(PathSegments)
    app.add_middleware(BodyLimit, limit=max_body)
    return app


def _plain(errors: Any) -> Any:
    """Validation errors as JSON (pydantic puts exceptions and bytes in ``ctx``)."""
    import json

    return json.loads(json.dumps(errors, default=str))

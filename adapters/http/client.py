"""A Python client of ``quick serve``'s HTTP API, sync (:class:`RemoteQuick`) and async
(:class:`AsyncRemoteQuick`), for producers and pull consumers on other machines.

Both build the same requests (:class:`_Call`) and read the same answers
(:func:`_answer`); only the transport differs. Errors come back as the library's own: a
lost lease is :class:`~quickzones.errors.LeaseLost`, a missing item
:class:`~quickzones.errors.ItemNotFound`, anything else a :class:`RemoteError` with the
server's ``error`` code and sentence; a server that cannot be reached or does not answer
in time is :class:`RemoteUnavailable` (a RemoteError; httpx's error is its ``__cause__``),
and an answer that is not the API's JSON a RemoteError ``bad_response``. No httpx error
gets through.

    with RemoteQuick("http://127.0.0.1:8000", token) as rq:
        rq.enqueue("send_email", {"to": "a@example.com"}, app="mail", tenant="user-1")
        for lease in rq.lease(max_items=10, wait_s=5):
            ...
            rq.complete(lease)
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from quickzones.errors import ItemGone as ItemGone  # re-exported: it was defined here
from quickzones.errors import ItemNotFound, LeaseLost, QuickError
from quickzones.repeated_failure import backoff
from quickzones.store.enqueue import Enqueued
from quickzones.store.flow_keys import Debounce
from quickzones.store.outcomes import JobStatus, ResultNotAvailable, ResultWait
from quickzones.store.validation import check_seconds


class RemoteError(QuickError):
    """The server refused a request: ``status`` and its ``error`` code say why."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"HTTP {status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail


class RemoteUnavailable(RemoteError):
    """The request got no answer: the server could not be reached, the connection broke,
    or it did not answer within the timeout (``status`` 0, ``error`` "unavailable")."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, "unavailable", detail)


@dataclass(frozen=True, slots=True)
class RemoteLease:
    """An item leased through the API, with what completing it needs."""

    app: str
    tenant: str
    item_id: str
    lease_id: str
    job_type: str
    payload: Any  # bytes, or the JSON value
    attempts: int
    error_count: int
    enqueued_ms: int
    lease_expires_ms: int
    priority: int = 0
    last_error: str | None = None
    vested_ms: int | None = None  # when it vested: its pickup is counted from there
    # What earlier failed runs left for this one (their nacks' ``meta``): ``ctx.meta``.
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)


def _seg(value: str) -> str:
    return quote(value, safe="")


def _item_path(app: str, tenant: str, item_id: str) -> str:
    return f"/v1/apps/{_seg(app)}/tenants/{_seg(tenant)}/items/{_seg(item_id)}"


def _payload_fields(payload: Any) -> dict[str, Any]:
    if isinstance(payload, bytes | bytearray | memoryview):
        return {"payload_b64": base64.b64encode(bytes(payload)).decode("ascii")}
    return {"payload": payload}


def _result_fields(value: Any) -> dict[str, Any]:
    """A handler's return value as a completion carries it (none when None)."""
    if value is None:
        return {}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"result_b64": base64.b64encode(bytes(value)).decode("ascii")}
    return {"result": value}


def _result_of(body: dict[str, Any]) -> Any:
    b64 = body.get("result_b64")
    return base64.b64decode(b64) if b64 is not None else body.get("result")


def _status_of(body: dict[str, Any]) -> JobStatus:
    """The API's item state as :meth:`Quick.status` returns it."""
    return JobStatus(
        state=body["state"],
        at_ms=body["at_ms"],
        attempts=body["attempts"],
        error_count=body["error_count"],
        next_vesting_ms=body.get("next_vesting_ms"),
        last_error=body.get("last_error"),
        has_result=bool(body.get("has_result", False)),
        progress=body.get("progress"),
        progress_note=body.get("progress_note"),
    )


# The API's answers when there is no result: wait (pending), or there will be none.
_NO_RESULT = {"result_pending": True, "result_not_available": False}


def _no_result(err: RemoteError, item_id: str) -> ResultNotAvailable | None:
    pending = _NO_RESULT.get(err.error)
    return None if pending is None else ResultNotAvailable(item_id, err.detail, pending=pending)


def _answer(response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    try:
        body = response.json()
    except ValueError:
        raise RemoteError(
            response.status_code, "bad_response", f"not the API's JSON: {response.text[:200]}"
        ) from None
    if response.status_code < 300:
        return body
    error = str(body.get("error", "error")) if isinstance(body, dict) else "error"
    detail = str(body.get("detail", "")) if isinstance(body, dict) else str(body)
    item_id = body.get("item_id") if isinstance(body, dict) else None
    if error == "item_gone":
        raise ItemGone(str(item_id or ""), detail or None)
    if error == "lease_lost":
        raise LeaseLost(str(item_id or ""), detail or None)
    if error == "item_not_found":
        raise ItemNotFound(str(item_id or ""))
    raise RemoteError(response.status_code, error, detail)


def _unavailable(call: _Call, err: httpx.HTTPError) -> RemoteUnavailable:
    return RemoteUnavailable(f"{call.method} {call.path}: {type(err).__name__}: {err}")


def _lease_of(raw: dict[str, Any]) -> RemoteLease:
    b64 = raw.get("payload_b64")
    return RemoteLease(
        app=raw["app"],
        tenant=raw["tenant"],
        item_id=raw["item_id"],
        lease_id=raw["lease_id"],
        job_type=raw["job_type"],
        payload=base64.b64decode(b64) if b64 is not None else raw.get("payload"),
        attempts=raw["attempts"],
        error_count=raw["error_count"],
        enqueued_ms=raw["enqueued_ms"],
        lease_expires_ms=raw["lease_expires_ms"],
        priority=raw.get("priority", 0),
        last_error=raw.get("last_error"),
        vested_ms=raw.get("vested_ms"),
        meta=dict(raw.get("meta") or {}),
    )


class _Calls:
    """The API's requests, shared by the sync and async clients."""

    @staticmethod
    def enqueue(
        job_type: str,
        payload: Any,
        app: str,
        tenant: str,
        delay: float,
        priority: int,
        item_id: str | None,
        ttl: float | None,
        flow: dict[str, Any] | None = None,
    ) -> _Call:
        body = {"job_type": job_type, "delay_s": delay, "priority": priority, "item_id": item_id,
                "ttl_s": ttl, **_payload_fields(payload), **(flow or {})}  # fmt: skip
        return _Call("POST", f"/v1/apps/{_seg(app)}/tenants/{_seg(tenant)}/items", body)

    @staticmethod
    def enqueue_many(
        job_type: str, payloads: Iterable[Any], app: str, tenant: str, delay: float, priority: int
    ) -> _Call:
        body = {"job_type": job_type, "delay_s": delay, "priority": priority,
                "items": [_payload_fields(p) for p in payloads]}  # fmt: skip
        return _Call("POST", f"/v1/apps/{_seg(app)}/tenants/{_seg(tenant)}/batches", body)

    @staticmethod
    def lease(
        max_items: int,
        wait_s: float,
        lease_s: float,
        app: str | None,
        job_types: Any,
        fill_s: float | None = None,
        pool_caps: dict[str, int] | None = None,
        named_limits: dict[str, dict[str, Any]] | None = None,
    ) -> _Call:
        body: dict[str, Any] = {
            "max_items": max_items, "wait_s": wait_s, "lease_s": lease_s, "app": app,
            "job_types": None if job_types is None else list(job_types)}  # fmt: skip
        if fill_s is not None:
            body["fill_s"] = fill_s
        if pool_caps:
            body["pool_caps"] = dict(pool_caps)
        if named_limits:
            body["named_limits"] = dict(named_limits)
        return _Call("POST", "/v1/leases", body)

    @staticmethod
    def on_lease(lease: RemoteLease, verb: str, **fields: Any) -> _Call:
        path = _item_path(lease.app, lease.tenant, lease.item_id) + "/" + verb
        return _Call("POST", path, {"lease_id": lease.lease_id, **fields})

    @staticmethod
    def nack(
        lease: RemoteLease, delay_s: float, error: str | None, ran: bool, meta: Any
    ) -> _Call:
        fields: dict[str, Any] = {"delay_s": delay_s, "error": error, "ran": ran}
        if meta:  # only when given: a server before retry_meta refuses the field
            fields["meta"] = meta
        return _Calls.on_lease(lease, "nack", **fields)

    @staticmethod
    def complete_many(leases: Sequence[RemoteLease], results: Sequence[Any] | None = None) -> _Call:
        items = [{"app": x.app, "tenant": x.tenant, "item_id": x.item_id,
                  "lease_id": x.lease_id} for x in leases]  # fmt: skip
        if results is not None:
            for item, value in zip(items, results, strict=True):
                item.update(_result_fields(value))
        return _Call("POST", "/v1/completions", {"items": items})

    @staticmethod
    def cancelled(leases: Sequence[RemoteLease]) -> _Call:
        items = [{"app": x.app, "tenant": x.tenant, "item_id": x.item_id,
                  "lease_id": x.lease_id} for x in leases]  # fmt: skip
        return _Call("POST", "/v1/leases/cancelled", {"items": items})

    @staticmethod
    def result(app: str, tenant: str, item_id: str) -> _Call:
        return _Call("GET", _item_path(app, tenant, item_id) + "/result")

    @staticmethod
    def pauses(app: str, method: str, tenant: str | None, job_type: str | None) -> _Call:
        path = f"/v1/apps/{_seg(app)}/pauses"
        target = {k: v for k, v in (("tenant", tenant), ("job_type", job_type)) if v is not None}
        if method == "POST":
            return _Call(method, path, target)
        return _Call(method, path, params=target)

    @staticmethod
    def dead_letters(app: str, filters: dict[str, Any], verb: str | None) -> _Call:
        path = f"/v1/apps/{_seg(app)}/dead-letters"
        if verb is None:
            return _Call("GET", path, params={k: v for k, v in filters.items() if v is not None})
        return _Call("POST", f"{path}/{verb}", filters)


def _http_options(url: str, token: str, timeout_s: float) -> dict[str, Any]:
    """What the sync and the async client both give httpx."""
    return {
        "base_url": url.rstrip("/"),
        "headers": {"Authorization": f"Bearer {token}"},
        "timeout": timeout_s,
    }


# Items per request of complete_many (the server takes at most 1000).
COMPLETE_BATCH_MAX = 1000
# Rows per page when the client reads a whole paged list (the server's most).
PAGE_MAX = 1000


def _batches(leases: Sequence[RemoteLease]) -> list[tuple[int, Sequence[RemoteLease]]]:
    """The requests' slices of ``leases``, each with where it starts."""
    step = COMPLETE_BATCH_MAX
    return [(i, leases[i : i + step]) for i in range(0, len(leases), step)]


def _completed(body: dict[str, Any]) -> list[QuickError | None]:
    out: list[QuickError | None] = []
    for r in body["results"]:
        outcome = r["outcome"]
        if outcome == "completed":
            out.append(None)
        elif outcome in ("lease_lost", "item_gone"):
            out.append((ItemGone if outcome == "item_gone" else LeaseLost)(r["item_id"]))
        else:
            out.append(RemoteError(200, outcome, f"item {r['item_id']!r}: {outcome}"))
    return out


def _flow_fields(
    idempotency_key: str | None,
    idempotency_ttl_s: float | None,
    debounce: Debounce | None,
    one_at_a_time: str | None = None,
) -> dict[str, Any]:
    """The enqueue's flow key fields, only those given (the server checks them)."""
    out: dict[str, Any] = {}
    if one_at_a_time is not None:
        out["one_at_a_time"] = one_at_a_time
    if idempotency_key is not None:
        out["idempotency_key"] = idempotency_key
    if idempotency_ttl_s is not None:
        out["idempotency_ttl_s"] = idempotency_ttl_s
    if debounce is not None:
        out["debounce"] = {
            "key": debounce.key,
            "wait_s": debounce.wait_s,
            "max_wait_s": debounce.max_wait_s,
        }
    return out


def _enqueued(body: dict[str, Any]) -> Enqueued:
    return Enqueued(body["item_id"], body.get("duplicate"))


class RemoteQuick:
    """The API from synchronous code (one ``httpx.Client``, kept alive)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(**_http_options(url, token, timeout_s), transport=transport)
        self.url = url.rstrip("/")  # the server, as messages name it
        self.timeout_s = timeout_s

    def __enter__(self) -> RemoteQuick:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _do(self, call: _Call, *, timeout_s: float | None = None) -> Any:
        try:
            response = self._http.request(
                call.method,
                call.path,
                json=call.json,
                params=call.params or None,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
            )
        except httpx.HTTPError as err:
            raise _unavailable(call, err) from err
        return _answer(response)

    # producers
    def enqueue(self, job_type: str, payload: Any = None, *, app: str, tenant: str,
                delay: float = 0.0, priority: int = 0, item_id: str | None = None,
                ttl: float | None = None, idempotency_key: str | None = None,
                idempotency_ttl_s: float | None = None,
                debounce: Debounce | None = None,
                one_at_a_time: str | None = None) -> Enqueued:  # fmt: skip
        """Enqueue one item; returns its id (``duplicate`` set when the id or the
        idempotency key was known, "debounced" when merged: docs/flow-control.md)."""
        flow = _flow_fields(idempotency_key, idempotency_ttl_s, debounce, one_at_a_time)
        call = _Calls.enqueue(job_type, payload, app, tenant, delay, priority, item_id, ttl, flow)
        return _enqueued(self._do(call))

    def enqueue_many(self, job_type: str, payloads: Iterable[Any], *, app: str, tenant: str,
                     delay: float = 0.0, priority: int = 0) -> list[str]:  # fmt: skip
        """Enqueue several items into one zone, all or none."""
        body = self._do(_Calls.enqueue_many(job_type, payloads, app, tenant, delay, priority))
        return list(body["item_ids"])

    def status(self, app: str, tenant: str, item_id: str) -> JobStatus | None:
        """The item's state (queued, leased, completed, ...) as :meth:`Quick.status`
        gives it, or None if unknown."""
        try:
            return _status_of(self._do(_Call("GET", _item_path(app, tenant, item_id))))
        except ItemNotFound:
            return None

    def result(self, app: str, tenant: str, item_id: str, *, timeout: float = 0.0) -> Any:
        """A completed item's kept result, as :meth:`Quick.result`: waits up to
        ``timeout`` seconds for an unfinished item, reading again with backoff (50 ms
        doubling to 1 s); raises :class:`ResultNotAvailable` saying why there is none."""
        wait = ResultWait(check_seconds("timeout", timeout))
        while True:
            try:
                return _result_of(self._do(_Calls.result(app, tenant, item_id)))
            except RemoteError as err:
                missing = _no_result(err, item_id)
                if missing is None:
                    raise
            time.sleep(wait.sleep_after(missing))

    def cancel(self, app: str, tenant: str, item_id: str) -> None:
        self._do(_Call("DELETE", _item_path(app, tenant, item_id)))

    # pull consumers
    def lease(self, max_items: int = 1, *, wait_s: float = 0.0, lease_s: float = 30.0,
              app: str | None = None, job_types: Iterable[str] | None = None,
              fill_s: float | None = None,
              pool_caps: dict[str, int] | None = None,
              named_limits: dict[str, dict[str, Any]] | None = None,
              ) -> list[RemoteLease]:  # fmt: skip
        """Up to ``max_items`` leased items, waiting up to ``wait_s`` for the first. With
        ``fill_s``, a lease that holds items stops visiting zones that long after its scan
        began (fewer items per call, each handed out sooner). ``pool_caps``: job type ->
        its ``pool_max_concurrency``; ``named_limits``: job type -> ``{"limits": [...],
        "cost": n}``, the named limits a run of it takes (a remote worker sends its
        handlers')."""
        call = _Calls.lease(
            max_items, wait_s, lease_s, app, job_types, fill_s, pool_caps, named_limits
        )
        body = self._do(call, timeout_s=self.timeout_s + wait_s)
        return [_lease_of(x) for x in body["items"]]

    def complete(self, lease: RemoteLease, result: Any = None) -> None:
        """Complete the item; ``result``: the handler's return value, kept as its job
        type's ``keep_result_s`` says."""
        self._do(_Calls.on_lease(lease, "complete", **_result_fields(result)))

    def complete_many(
        self, leases: Sequence[RemoteLease], results: Sequence[Any] | None = None
    ) -> list[QuickError | None]:
        """Complete several leases in one request (one commit per zone on the server).
        One outcome per lease, in order: None when completed, :class:`LeaseLost` when the
        lease was lost or the item is gone (what :meth:`complete` raises); a lease that
        was not completed is never retried here. ``results``: the handlers' return
        values, one per lease."""
        out: list[QuickError | None] = []
        for start, batch in _batches(leases):
            kept = None if results is None else results[start : start + len(batch)]
            out.extend(_completed(self._do(_Calls.complete_many(batch, kept))))
        return out

    def cancelled(self, leases: Sequence[RemoteLease]) -> list[bool]:
        """Which of these leased items were cancelled (or went otherwise) meanwhile: one
        request per 1,000, one answer per lease, in order."""
        out: list[bool] = []
        for _, batch in _batches(leases):
            out.extend(bool(x) for x in self._do(_Calls.cancelled(batch))["cancelled"])
        return out

    def extend(self, lease: RemoteLease, lease_s: float = 30.0) -> int:
        """Hold the lease ``lease_s`` more seconds; returns its new end (ms)."""
        return int(self._do(_Calls.on_lease(lease, "extend", lease_s=lease_s))["lease_expires_ms"])

    def nack(
        self,
        lease: RemoteLease,
        delay_s: float = 0.0,
        error: str | None = None,
        *,
        ran: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Give the item back to run after ``delay_s``; ``error`` counts the run as an
        error; ``ran=False``: it never started (the run is not counted); ``meta``: merged
        into the item's metadata, what the next run sees (``JobContext.retry_meta``)."""
        self._do(_Calls.nack(lease, delay_s, error, ran, meta))

    def fail(self, lease: RemoteLease, reason: str, traceback: str | None = None) -> None:
        self._do(_Calls.on_lease(lease, "fail", reason=reason, traceback=traceback))

    def progress(self, lease: RemoteLease, fraction: float, note: str | None = None) -> None:
        """Keep the running handler's progress with the item (``ctx.progress``)."""
        self._do(_Calls.on_lease(lease, "progress", fraction=fraction, note=note))

    # admin
    def stats(self, app: str) -> dict[str, Any]:
        out: dict[str, Any] = self._do(_Call("GET", f"/v1/apps/{_seg(app)}/stats"))
        return out

    def dead_letters(self, app: str, **filters: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self._do(_Calls.dead_letters(app, filters, None))[
            "dead_letters"
        ]
        return out

    def requeue_dead_letters(self, app: str, **filters: Any) -> int:
        return int(self._do(_Calls.dead_letters(app, filters, "requeue"))["count"])

    def purge_dead_letters(self, app: str, **filters: Any) -> int:
        return int(self._do(_Calls.dead_letters(app, filters, "purge"))["count"])

    def pause(
        self, app: str, *, tenant: str | None = None, job_type: str | None = None
    ) -> dict[str, Any]:
        """Hold back the app, one tenant or one job type (:meth:`Quick.pause`)."""
        out: dict[str, Any] = self._do(_Calls.pauses(app, "POST", tenant, job_type))
        return out

    def resume(self, app: str, *, tenant: str | None = None, job_type: str | None = None) -> bool:
        """Lift the pause named exactly so; False when there was none."""
        try:
            self._do(_Calls.pauses(app, "DELETE", tenant, job_type))
        except RemoteError as err:
            if err.error == "not_paused":
                return False
            raise
        return True

    def paused(self, app: str) -> list[dict[str, Any]]:
        """The pauses that hold back some of ``app`` (every page)."""
        return self._every_page(f"/v1/apps/{_seg(app)}/pauses", "pauses")

    def _every_page(self, path: str, key: str) -> list[dict[str, Any]]:
        """Every row of a paged list (the server's Paged lists), following next_cursor."""
        out: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": PAGE_MAX}
        while True:
            body = self._do(_Call("GET", path, params=dict(params)))
            out += body[key]
            if body.get("next_cursor") is None:
                return out
            params["cursor"] = body["next_cursor"]

    def batch_status(self, app: str, batch_id: str) -> dict[str, Any] | None:
        """A batch's state as ``GET /v1/apps/{app}/batches/{id}`` gives it (the fields of
        :meth:`Quick.batch_status`), or None when the app has no such batch."""
        try:
            out: dict[str, Any] = self._do(
                _Call("GET", f"/v1/apps/{_seg(app)}/batches/{_seg(batch_id)}")
            )
        except RemoteError as err:
            if err.error == "batch_not_found":
                return None
            raise
        return out

    def set_weight(self, app: str, tenant: str | None, weight: float) -> dict[str, Any]:
        """A tenant's weight, or the app's default (:meth:`Quick.set_weight`)."""
        body = {"tenant": tenant, "weight": weight}
        out: dict[str, Any] = self._do(_Call("PUT", f"/v1/apps/{_seg(app)}/weights", body))
        return out

    def weights(self, app: str) -> list[dict[str, Any]]:
        """The app's stored weights (every page)."""
        return self._every_page(f"/v1/apps/{_seg(app)}/weights", "weights")

    def set_tenant_limit(self, app: str, tenant: str, **limit: Any) -> dict[str, Any]:
        """A tenant's limits: ``job_type``, ``max_running``, ``rate``, ``per_s``
        (:meth:`Quick.set_tenant_limit`)."""
        path = f"/v1/apps/{_seg(app)}/tenant-limits"
        out: dict[str, Any] = self._do(_Call("PUT", path, {"tenant": tenant, **limit}))
        return out

    def tenant_limits(self, app: str) -> list[dict[str, Any]]:
        """The app's per-tenant limits (every page)."""
        return self._every_page(f"/v1/apps/{_seg(app)}/tenant-limits", "limits")


class AsyncRemoteQuick:
    """The API from asyncio code (one ``httpx.AsyncClient``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(**_http_options(url, token, timeout_s), transport=transport)
        self.timeout_s = timeout_s

    async def __aenter__(self) -> AsyncRemoteQuick:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _do(self, call: _Call, *, timeout_s: float | None = None) -> Any:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                json=call.json,
                params=call.params or None,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
            )
        except httpx.HTTPError as err:
            raise _unavailable(call, err) from err
        return _answer(response)

    async def enqueue(self, job_type: str, payload: Any = None, *, app: str, tenant: str,
                      delay: float = 0.0, priority: int = 0, item_id: str | None = None,
                      ttl: float | None = None, idempotency_key: str | None = None,
                      idempotency_ttl_s: float | None = None,
                      debounce: Debounce | None = None,
                      one_at_a_time: str | None = None) -> Enqueued:  # fmt: skip
        flow = _flow_fields(idempotency_key, idempotency_ttl_s, debounce, one_at_a_time)
        call = _Calls.enqueue(job_type, payload, app, tenant, delay, priority, item_id, ttl, flow)
        return _enqueued(await self._do(call))

    async def enqueue_many(self, job_type: str, payloads: Iterable[Any], *, app: str,
                           tenant: str, delay: float = 0.0, priority: int = 0
                           ) -> list[str]:  # fmt: skip
        call = _Calls.enqueue_many(job_type, payloads, app, tenant, delay, priority)
        return list((await self._do(call))["item_ids"])

    async def status(self, app: str, tenant: str, item_id: str) -> JobStatus | None:
        try:
            return _status_of(await self._do(_Call("GET", _item_path(app, tenant, item_id))))
        except ItemNotFound:
            return None

    async def result(self, app: str, tenant: str, item_id: str, *, timeout: float = 0.0) -> Any:
        """:meth:`RemoteQuick.result`, waiting with ``asyncio.sleep``."""
        wait = ResultWait(check_seconds("timeout", timeout))
        while True:
            try:
                return _result_of(await self._do(_Calls.result(app, tenant, item_id)))
            except RemoteError as err:
                missing = _no_result(err, item_id)
                if missing is None:
                    raise
            await asyncio.sleep(wait.sleep_after(missing))

    async def cancel(self, app: str, tenant: str, item_id: str) -> None:
        await self._do(_Call("DELETE", _item_path(app, tenant, item_id)))

    async def lease(self, max_items: int = 1, *, wait_s: float = 0.0, lease_s: float = 30.0,
                    app: str | None = None, job_types: Iterable[str] | None = None,
                    fill_s: float | None = None,
                    pool_caps: dict[str, int] | None = None,
                    named_limits: dict[str, dict[str, Any]] | None = None,
                    ) -> list[RemoteLease]:  # fmt: skip
        call = _Calls.lease(
            max_items, wait_s, lease_s, app, job_types, fill_s, pool_caps, named_limits
        )
        body = await self._do(call, timeout_s=self.timeout_s + wait_s)
        return [_lease_of(x) for x in body["items"]]

    async def complete(self, lease: RemoteLease, result: Any = None) -> None:
        await self._do(_Calls.on_lease(lease, "complete", **_result_fields(result)))

    async def complete_many(
        self, leases: Sequence[RemoteLease], results: Sequence[Any] | None = None
    ) -> list[QuickError | None]:
        out: list[QuickError | None] = []
        for start, batch in _batches(leases):
            kept = None if results is None else results[start : start + len(batch)]
            out.extend(_completed(await self._do(_Calls.complete_many(batch, kept))))
        return out

    async def extend(self, lease: RemoteLease, lease_s: float = 30.0) -> int:
        body = await self._do(_Calls.on_lease(lease, "extend", lease_s=lease_s))
        return int(body["lease_expires_ms"])

    async def nack(
        self,
        lease: RemoteLease,
        delay_s: float = 0.0,
        error: str | None = None,
        *,
        ran: bool = True,
        meta: dict[str, Any] | None = None,
    ) -> None:
        await self._do(_Calls.nack(lease, delay_s, error, ran, meta))

    async def fail(self, lease: RemoteLease, reason: str, traceback: str | None = None) -> None:
        await self._do(_Calls.on_lease(lease, "fail", reason=reason, traceback=traceback))


def sleep_backoff(attempt: int) -> None:
    time.sleep(backoff(attempt))

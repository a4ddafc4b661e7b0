"""``/v1/apps/{app}/limits/{name}``: named limits shared by job types through ``quick
serve`` (admin role, for the route's app). They live in the store
(:mod:`quickzones.store.named_limits`): every consumer enforces a change within about a
second."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel

from quickzones.adapters.http.api import Admin, ApiError, allow_app, cleared, state_of
from quickzones.adapters.http.models import _Strict
from quickzones.store.named_limits import Limit, check_limit_name
from quickzones.store.validation import check_name

router = APIRouter(prefix="/v1", tags=["admin"])

LimitName = Annotated[str, Path(max_length=200)]


class NamedLimitIn(_Strict):
    """A named limit: at least one of concurrency, per_tenant and rate."""

    concurrency: int | None = None  # slots held at once, across every consumer
    per_tenant: int | None = None  # slots one tenant holds at once
    rate: int | None = None  # slots started per per_s seconds
    per_s: float = 1.0


class NamedLimitOut(BaseModel):
    app: str
    name: str
    concurrency: int | None
    per_tenant: int | None
    rate: int | None
    per_s: float


class NamedLimitsOut(BaseModel):
    app: str
    limits: list[NamedLimitOut]


def limit_out(limit: Limit) -> NamedLimitOut:
    return NamedLimitOut(
        app=limit.app,
        name=limit.name,
        concurrency=limit.concurrency,
        per_tenant=limit.per_tenant,
        rate=limit.rate,
        per_s=limit.per_s,
    )


@router.get("/apps/{app:seg}/limits")
def list_limits(app: str, request: Request, who: Admin) -> NamedLimitsOut:
    """The app's named limits."""
    q = state_of(request).q
    check_name("app", allow_app(who, app))
    return NamedLimitsOut(app=app, limits=[limit_out(x) for x in q.list_limits(app)])


@router.get("/apps/{app:seg}/limits/{name:seg}")
def get_limit(app: str, name: LimitName, request: Request, who: Admin) -> NamedLimitOut:
    """One named limit; 404 when the app does not define it."""
    limit = state_of(request).q.get_limit(allow_app(who, app), name)
    if limit is None:
        raise ApiError(404, "no_limit", f"app={app} has no limit {name}")
    return limit_out(limit)


@router.put("/apps/{app:seg}/limits/{name:seg}")
def set_limit(
    app: str, name: LimitName, body: NamedLimitIn, request: Request, who: Admin
) -> NamedLimitOut:
    """Declare or change (replace) a named limit; 400 stores nothing."""
    limit = state_of(request).q.set_limit(
        allow_app(who, app),
        check_limit_name(name),
        concurrency=body.concurrency,
        per_tenant=body.per_tenant,
        rate=body.rate,
        per=body.per_s,
    )
    return limit_out(limit)


@router.delete("/apps/{app:seg}/limits/{name:seg}", status_code=204)
def delete_limit(app: str, name: LimitName, request: Request, who: Admin) -> Response:
    """Drop a named limit; 404 when there was none. Job types naming it hold their items
    back until it is declared again."""
    found = state_of(request).q.delete_limit(allow_app(who, app), name)
    return cleared(found, "no_limit", f"app={app} has no limit {name}")

"""``/v1/apps/{app}/weights`` and ``/v1/apps/{app}/tenant-limits``: tenant weights and
per-tenant limits through ``quick serve`` (admin role, for the route's app). Both live in
the store (:mod:`quickzones.store.weights`, :mod:`quickzones.store.tenant_limits`): every
consumer follows them within about a second."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from quickzones.adapters.http.api import Admin, PageCursor, PageLimit, allow_app, cleared, state_of
from quickzones.adapters.http.models import _Strict
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.validation import check_name
from quickzones.store.weights import TenantWeight

router = APIRouter(prefix="/v1", tags=["admin"])


class WeightTarget(_Strict):
    """A tenant's weight, or (tenant left out) the app's default weight."""

    tenant: str | None = None
    weight: float


class WeightOut(BaseModel):
    app: str
    tenant: str | None  # None: the app's default, for its tenants without their own
    weight: float


class WeightsOut(BaseModel):
    """One page of an app's weights (its default first, then by tenant)."""

    app: str
    weights: list[WeightOut]
    next_cursor: str | None = None  # the next page's cursor; null: the last page


def weight_out(w: TenantWeight) -> WeightOut:
    return WeightOut(app=w.app, tenant=w.tenant, weight=w.weight)


@router.get("/apps/{app:seg}/weights")
def list_weights(
    app: str, request: Request, who: Admin, cursor: PageCursor = None, limit: PageLimit = 50
) -> WeightsOut:
    """A page of the app's stored weights (tenants without one weigh the default, or 1)
    from ``cursor`` (the ``next_cursor`` of the page before): it reads what it shows."""
    q = state_of(request).q
    page = q.weight_page(check_name("app", allow_app(who, app)), limit=limit, cursor=cursor)
    weights = [weight_out(w) for w in page.rows]
    return WeightsOut(app=app, weights=weights, next_cursor=page.next_cursor)


@router.put("/apps/{app:seg}/weights")
def set_weight(app: str, body: WeightTarget, request: Request, who: Admin) -> WeightOut:
    """Set a tenant's weight (0.001 to 1000) or the app's default; 400 stores nothing."""
    q = state_of(request).q
    return weight_out(q.set_weight(allow_app(who, app), body.tenant, body.weight))


@router.delete("/apps/{app:seg}/weights", status_code=204)
def clear_weight(
    app: str,
    request: Request,
    who: Admin,
    tenant: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Drop the weight named exactly so; 404 when there was none."""
    found = state_of(request).q.clear_weight(allow_app(who, app), tenant)
    return cleared(found, "no_weight", f"app={app} tenant={tenant} has no weight")


# --- per-tenant limits: /v1/apps/{app}/tenant-limits -------------------------------------


class LimitTarget(_Strict):
    """A tenant's limits (or its job type's): at least one of max_running and rate."""

    tenant: str
    job_type: str | None = None
    max_running: int | None = None
    rate: int | None = None
    per_s: float = 1.0


class LimitOut(BaseModel):
    app: str
    tenant: str
    job_type: str | None  # None: every job type of the tenant
    max_running: int | None
    rate: int | None
    per_s: float


class LimitsOut(BaseModel):
    """One page of an app's per-tenant limits (by tenant, then job type)."""

    app: str
    limits: list[LimitOut]
    next_cursor: str | None = None  # the next page's cursor; null: the last page


def limit_out(limit: TenantLimit) -> LimitOut:
    return LimitOut(
        app=limit.app,
        tenant=limit.tenant,
        job_type=limit.job_type,
        max_running=limit.max_running,
        rate=limit.rate,
        per_s=limit.per_s,
    )


@router.get("/apps/{app:seg}/tenant-limits")
def list_limits(
    app: str, request: Request, who: Admin, cursor: PageCursor = None, limit: PageLimit = 50
) -> LimitsOut:
    """A page of the app's per-tenant limits in force from ``cursor`` (the
    ``next_cursor`` of the page before): it reads what it shows."""
    q = state_of(request).q
    page = q.tenant_limit_page(check_name("app", allow_app(who, app)), limit=limit, cursor=cursor)
    limits = [limit_out(x) for x in page.rows]
    return LimitsOut(app=app, limits=limits, next_cursor=page.next_cursor)


@router.put("/apps/{app:seg}/tenant-limits")
def set_limit(app: str, body: LimitTarget, request: Request, who: Admin) -> LimitOut:
    """Set (replace) a tenant's limits; 400 stores nothing."""
    q = state_of(request).q
    limit = q.set_tenant_limit(
        allow_app(who, app),
        body.tenant,
        body.job_type,
        max_running=body.max_running,
        rate=body.rate,
        per=body.per_s,
    )
    return limit_out(limit)


@router.delete("/apps/{app:seg}/tenant-limits", status_code=204)
def clear_limit(
    app: str,
    request: Request,
    who: Admin,
    tenant: Annotated[str, Query(max_length=200)],
    job_type: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Lift the limit named exactly so; 404 when there was none."""
    found = state_of(request).q.clear_tenant_limit(allow_app(who, app), tenant, job_type)
    return cleared(found, "no_limit", f"app={app} tenant={tenant} has no such limit")

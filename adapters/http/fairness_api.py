"""``/v1/apps/{app}/weights``: tenant weights through ``quick serve`` (admin role, for the
route's app). The weights live in the store (:mod:`quickzones.store.weights`): every
consumer shares out by them within about a second."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from quickzones.adapters.http.api import Admin, ApiError, allow_app, state_of
from quickzones.adapters.http.models import _Strict
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
    app: str
    weights: list[WeightOut]


def weight_out(w: TenantWeight) -> WeightOut:
    return WeightOut(app=w.app, tenant=w.tenant, weight=w.weight)


@router.get("/apps/{app:seg}/weights")
def list_weights(app: str, request: Request, who: Admin) -> WeightsOut:
    """The app's stored weights (tenants without one weigh the default, or 1)."""
    q = state_of(request).q
    check_name("app", allow_app(who, app))
    return WeightsOut(app=app, weights=[weight_out(w) for w in q.weights() if w.app == app])


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
    q = state_of(request).q
    if not q.clear_weight(allow_app(who, app), tenant):
        raise ApiError(404, "no_weight", f"app={app} tenant={tenant} has no weight")
    return Response(status_code=204)

"""``GET /v1/apps/{app}/tenants/{tenant}/items/{id}/explain``: why an item has not started
(issue 45 point 3), rule by rule in the order a consumer applies them
(:mod:`quickzones.explain`); the producer role for the route's app, as reading the item
needs. The answer is :meth:`quickzones.explain.Explanation.as_dict`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from quickzones.adapters.http.api import Producer, allow_app, state_of
from quickzones.explain import explain

router = APIRouter(prefix="/v1", tags=["produce"])


@router.get("/apps/{app:seg}/tenants/{tenant:seg}/items/{item_id:seg}/explain")
def explain_item(
    app: str, tenant: str, item_id: str, request: Request, who: Producer
) -> dict[str, Any]:
    """The item's state and each rule between it and a worker, with its state now;
    ``first`` names the first rule holding it back (null: nothing does, the next scan
    takes it). An item not in its zone is answered too (state ``absent`` or finished)."""
    q = state_of(request).q
    return explain(q, allow_app(who, app), tenant, item_id).as_dict()

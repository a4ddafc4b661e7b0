"""``GET /v1/apps/{app}/batches/{batch_id}``: where a batch stands (issue 31 point 5), for
producers of the app: counts, its callback, and the items that did not complete
(:mod:`quickzones.store.batches`; docs/batches.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from quickzones.adapters.http.api import ApiError, Producer, allow_app, state_of
from quickzones.store.validation import check_name

router = APIRouter(prefix="/v1", tags=["produce"])


class FailedItem(BaseModel):
    tenant: str
    item_id: str
    state: str
    reason: str | None = None


class BatchOut(BaseModel):
    """A batch's counts; ``state`` is "running", "done" (its callback was enqueued) or
    "failed" (a chain's step did not complete, so the chain stopped)."""

    batch_id: str
    app: str
    state: str
    total: int
    completed: int
    dead_lettered: int
    cancelled: int
    pending: int
    callback_id: str | None
    callback_tenant: str | None
    callback_enqueued: bool
    failed: list[FailedItem]


@router.get("/apps/{app:seg}/batches/{batch_id:seg}")
def batch_status(app: str, batch_id: str, request: Request, who: Producer) -> BatchOut:
    """Where the batch stands; 404 when the app has no batch of this id."""
    q = state_of(request).q
    status = q.batch_status(check_name("app", allow_app(who, app)), batch_id)
    if status is None:
        raise ApiError(404, "batch_not_found", f"no batch {batch_id!r} in app {app}")
    return BatchOut.model_validate(status.as_dict())

"""``/v1/apps/{app}/pauses``: pause and resume an app, a tenant or a job type through
``quick serve`` (admin role, for the route's app). The pauses live in the store
(:mod:`quickzones.store.pauses`): every consumer and this server's pull leaser hold back
the same work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from quickzones.adapters.http import models as m
from quickzones.adapters.http.api import Admin, PageCursor, PageLimit, allow_app, cleared, state_of
from quickzones.store.pauses import Pause
from quickzones.store.validation import check_name

router = APIRouter(prefix="/v1", tags=["admin"])


def pause_out(p: Pause) -> m.PauseOut:
    return m.PauseOut(app=p.app, tenant=p.tenant, job_type=p.job_type, since_ms=p.since_ms)


@router.get("/apps/{app:seg}/pauses")
def list_pauses(
    app: str, request: Request, who: Admin, cursor: PageCursor = None, limit: PageLimit = 50
) -> m.Pauses:
    """A page of the pauses in force for the app (the job types paused in every app
    first, then its own) from ``cursor`` (the ``next_cursor`` of the page before): it
    reads what it shows."""
    q = state_of(request).q
    page = q.pause_page(check_name("app", allow_app(who, app)), limit=limit, cursor=cursor)
    pauses = [pause_out(p) for p in page.rows]
    return m.Pauses(app=app, pauses=pauses, next_cursor=page.next_cursor)


@router.post("/apps/{app:seg}/pauses", status_code=201)
def pause(app: str, body: m.PauseTarget, request: Request, who: Admin) -> m.PauseOut:
    """Hold back the app, one tenant or one job type: nothing of it starts on any
    consumer within about a second; running items finish, enqueues are accepted."""
    q = state_of(request).q
    return pause_out(q.pause(allow_app(who, app), body.tenant, body.job_type))


@router.delete("/apps/{app:seg}/pauses", status_code=204)
def resume(
    app: str,
    request: Request,
    who: Admin,
    tenant: Annotated[str | None, Query(max_length=200)] = None,
    job_type: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Lift the pause named exactly so; 404 when there was none."""
    found = state_of(request).q.resume(allow_app(who, app), tenant, job_type)
    target = Pause.of(app, tenant, job_type).describe()
    return cleared(found, "not_paused", f"{target} is not paused")

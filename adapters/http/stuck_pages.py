"""The dashboard's "what is stuck" pages (issue 45 point 4): an app's running items, its
failed runs per job type over the last hour, and its dead letters grouped by job type and
error with a group's requeue. Mounted by
:func:`quickzones.adapters.http.dashboard.mount_dashboard` with its session and page
helpers, so they keep its rules (signed in, scoped to the token's apps; the requeue an
admin's POST with the session's CSRF token after its confirmation page). What each page
reads is in :mod:`quickzones.adapters.http.stuck`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import RedirectResponse, Response

from quickzones.adapters.http import charts, stuck
from quickzones.store import dead_groups, heartbeats
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.adapters.http.dashboard import Dashboard
    from quickzones.adapters.http.tokens import TokenInfo

_PAGE = 50


def mount_stuck_pages(
    app: FastAPI,
    board: Dashboard,
    *,
    page: Callable[..., Response],
    admit: Callable[[Request, str], tuple[TokenInfo | None, Response | None]],
    admin_page: Callable[[Request, str], TokenInfo | Response],
    admin_post: Callable[[Request, str, str, str], TokenInfo | Response],
) -> None:
    q = board.state.q

    @app.get("/apps/{app_name}/running", include_in_schema=False)
    def running_page(request: Request, app_name: str, cursor: str = "") -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        found = stuck.running_page(q, app_name, _PAGE, cursor or None)
        return page(
            request, "running.html", who, app=app_name, rows=found.page.rows, cursor=cursor,
            next_cursor=found.page.next_cursor, min_runs=stuck.MIN_RUNS,
            unlisted=found.unlisted, listed_max=heartbeats.RUNNING_MAX,
        )  # fmt: skip

    @app.get("/apps/{app_name}/errors", include_in_schema=False)
    def errors_page(request: Request, app_name: str) -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        seen = stuck.errors(q, app_name)
        job_types = [t for t, _ in seen.hour.most_common()]
        colours = {t: charts.PALETTE[n % len(charts.PALETTE)] for n, t in enumerate(job_types)}
        return page(
            request, "errors.html", who, app=app_name, errors=seen, job_types=job_types,
            colours=colours, chart=charts.errors_chart(seen.minutes, job_types),
        )  # fmt: skip

    @app.get("/apps/{app_name}/dead-letters/groups", include_in_schema=False)
    def groups_page(request: Request, app_name: str, cursor: str = "", done: str = "") -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        found = dead_groups.group_page(q.kv, q.keys, app_name, limit=_PAGE, cursor=cursor or None)
        more = {k: request.query_params.get(k, "") for k in ("more", "job_type", "error")}
        return page(
            request, "dead_letter_groups.html", who, app=app_name, groups=found.rows,
            cursor=cursor, next_cursor=found.next_cursor, done=done, more=more,
        )  # fmt: skip

    @app.get("/apps/{app_name}/dead-letters/groups/confirm", include_in_schema=False)
    def group_confirm(
        request: Request, app_name: str, job_type: str = "", error: str = ""
    ) -> Response:
        who = admin_page(request, app_name)
        if isinstance(who, Response):
            return who
        count = dead_groups.group_count(q.kv, q.keys, app_name, (job_type, error))
        return page(
            request, "group_confirm.html", who, app=app_name, job_type=job_type, error=error,
            count=count, bound=stuck.GROUP_REQUEUE_MAX,
        )  # fmt: skip

    @app.post("/apps/{app_name}/dead-letters/groups/requeue", include_in_schema=False)
    def group_requeue(
        request: Request,
        app_name: str,
        csrf: str = Form(""),
        confirm: str = Form(""),
        job_type: str = Form("", max_length=200),
        error: str = Form("", max_length=dead_groups.ERROR_CHARS),
        cursor: str = Form(""),
    ) -> Response:
        who = admin_post(request, app_name, csrf, confirm)
        if isinstance(who, Response):
            return who
        check_name("app", app_name)
        done = stuck.requeue_group(q, app_name, job_type, error, cursor or None)
        board.forget()
        note = f"requeued {done.requeued} of {job_type}: {error}"
        if done.skipped:
            note += f", skipped {done.skipped}"
        query = {"done": note}
        if done.next_cursor is not None:
            query.update(more=done.next_cursor, job_type=job_type, error=error)
        where = f"/apps/{quote(app_name, safe='')}/dead-letters/groups?" + urlencode(query)
        return RedirectResponse(where, 303)

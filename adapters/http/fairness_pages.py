"""The dashboard's fairness view, history charts, workers page, pause and weight controls (issue
31 point 6), mounted by :func:`quickzones.adapters.http.dashboard.mount_dashboard` with
its session and page helpers, so they keep its rules: signed in with an admin or view
token, scoped to the token's apps, and every change an admin's POST with the session's
CSRF token that follows a confirmation page (a view token sees no control)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from quickzones.adapters.http import charts, fairness
from quickzones.adapters.http.live_parts import LiveParts
from quickzones.clock import now_ms
from quickzones.errors import InvalidArgument
from quickzones.store.pauses import Pause, PauseSet
from quickzones.store.pickups import percentile_label
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.adapters.http.dashboard import Dashboard
    from quickzones.adapters.http.tokens import TokenInfo
    from quickzones.client import Quick

_ACTIONS = ("pause", "resume")


def mount_fairness_pages(
    app: FastAPI,
    board: Dashboard,
    *,
    session: Callable[[Request], TokenInfo | None],
    page: Callable[..., Response],
    admit: Callable[[Request, str], tuple[TokenInfo | None, Response | None]],
    admin_page: Callable[[Request, str], TokenInfo | Response],
    admin_post: Callable[[Request, str, str, str], TokenInfo | Response],
    login_redirect: Callable[[Request], Response],
    templates: Jinja2Templates,
) -> None:
    """``admin_page`` and ``admin_post``: the dashboard's one guard of every control
    (admin role, CSRF token, confirmation), written in ``mount_dashboard``."""
    q = board.state.q

    def view_of(
        app_name: str, section: str, cursor: str, search: str, limit: str
    ) -> fairness.Fairness | Response:
        """The view a page or its live refresh asks for, or the 400 that says what is
        wrong with the asking. Not cached: it reads a bounded amount."""
        try:
            check_name("app", app_name)
            if limit and not limit.isdigit():
                raise InvalidArgument("limit", limit, "must be a whole number")
            size = _page_size(section, search, limit)
            return fairness.fairness(
                q, app_name, section=section or None, cursor=cursor or None,
                limit=size, search=search or None,
            )  # fmt: skip
        except InvalidArgument as err:
            return _bad_request(str(err))

    def live_of(
        app_name: str, who: TokenInfo, view: fairness.Fairness, search: str, limit: int
    ) -> tuple[LiveParts, int]:
        """The view's parts: each section's rows and last row, the figures, the charts."""
        parts_of = templates.env.get_template("fairness_parts.html").module
        admin = who.has_role("admin")
        points = board.cached(f"history:{app_name}", 5.0, lambda: fairness.history(q, app_name))
        started_hour = sum(p.started for p in points)
        parts: dict[str, str] = {
            "figures": str(parts_of.figures(view, started_hour)),  # type: ignore[attr-defined]
            "charts": str(parts_of.charts(  # type: ignore[attr-defined]
                charts.throughput_chart(points), charts.latency_chart(points)
            )),
        }  # fmt: skip
        layout: dict[str, list[str]] = {}
        for s in view.sections:
            ids = []
            for r in s.rows:
                part_id = f"{s.name}/{r.tenant}"
                parts[part_id] = str(parts_of.row(r, s.name, app_name, admin, percentile_label))  # type: ignore[attr-defined]
                ids.append(part_id)
            parts[f"{s.name}:last"] = str(parts_of.last(s, app_name, search, limit))  # type: ignore[attr-defined]
            layout[s.name] = [*ids, f"{s.name}:last"]
        return LiveParts(parts, layout), started_hour

    @app.get("/apps/{app_name}/fairness", include_in_schema=False)
    def fairness_page(
        request: Request,
        app_name: str,
        done: str = "",
        section: str = "",
        cursor: str = "",
        search: str = "",
        limit: str = "",
    ) -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        view = view_of(app_name, section, cursor, search, limit)
        if isinstance(view, Response):
            return view
        live, _ = live_of(app_name, who, view, search, _page_size(section, search, limit))
        query = urlencode(
            {k: v for k, v in (("section", section), ("cursor", cursor), ("search", search),
                               ("limit", limit)) if v}
        )  # fmt: skip
        return page(
            request, "fairness.html", who, app=app_name, view=view, done=done, live=live,
            pauses=_app_pauses(q, app_name), section=section, search=search, query=query,
            now_ms=view.now_ms,
        )  # fmt: skip

    @app.get("/apps/{app_name}/fairness.json", include_in_schema=False)
    def fairness_json(
        request: Request,
        app_name: str,
        section: str = "",
        cursor: str = "",
        search: str = "",
        limit: str = "",
        since: str = "",
    ) -> Response:
        """The live refresh: 304 when the view is what ``since`` names; else the
        sections' layout and only the parts ``since`` does not hold."""
        who = session(request)
        if who is None:
            return JSONResponse({"error": "unauthenticated"}, 401)
        if not who.allows_app(app_name):
            return JSONResponse({"error": "forbidden", "detail": f"not app {app_name!r}"}, 403)
        view = view_of(app_name, section, cursor, search, limit)
        if isinstance(view, Response):
            return view
        live, _ = live_of(app_name, who, view, search, _page_size(section, search, limit))
        changed = live.changed_since(since)
        if changed is None:
            return Response(status_code=304)
        sections = {
            s.name: {
                "tenants": [r.tenant for r in s.rows],
                "parts": live.layout[s.name],
                "next_cursor": s.next_cursor,
            }
            for s in view.sections
        }
        return JSONResponse(
            {"version": live.version, "sections": sections, "parts": changed,
             "updated": str(templates.env.globals["when"](view.now_ms))},  # type: ignore[operator]
            headers={"Cache-Control": "no-store"},
        )  # fmt: skip

    @app.get("/workers", include_in_schema=False)
    def workers_page(request: Request) -> Response:
        who = session(request)
        if who is None:
            return login_redirect(request)
        allowed = None if who.all_apps else {who.app}
        found = board.cached(f"workers:{allowed}", 2.0, lambda: fairness.consumers(q, allowed))
        return page(request, "workers.html", who, consumers=found, now_ms=now_ms(q.clock))

    @app.get("/apps/{app_name}/pauses/confirm", include_in_schema=False)
    def pause_confirm(
        request: Request, app_name: str, action: str, tenant: str = "", job_type: str = ""
    ) -> Response:
        who = admin_page(request, app_name)
        if isinstance(who, Response):
            return who
        target = _pause_of(action, app_name, tenant, job_type)
        if isinstance(target, Response):
            return target
        return page(
            request, "pause_confirm.html", who, app=app_name, action=action,
            tenant=tenant, job_type=job_type, target=target,
        )  # fmt: skip

    @app.post("/apps/{app_name}/pauses/{action}", include_in_schema=False)
    def pause_act(
        request: Request,
        app_name: str,
        action: str,
        csrf: str = Form(""),
        confirm: str = Form(""),
        tenant: str = Form(""),
        job_type: str = Form(""),
    ) -> Response:
        who = admin_post(request, app_name, csrf, confirm)
        if isinstance(who, Response):
            return who
        target = _pause_of(action, app_name, tenant, job_type)
        if isinstance(target, Response):
            return target
        if action == "pause":
            q.pause(target.app, target.tenant, target.job_type)
            note = f"paused {target.describe()}"
        else:
            lifted = q.resume(target.app, target.tenant, target.job_type)
            note = (
                f"resumed {target.describe()}" if lifted else f"{target.describe()} was not paused"
            )
        board.forget()
        where = f"/apps/{quote(app_name, safe='')}/fairness?" + urlencode({"done": note})
        return RedirectResponse(where, 303)

    @app.get("/apps/{app_name}/weights/confirm", include_in_schema=False)
    def weight_confirm(
        request: Request, app_name: str, weight: str = "", tenant: str = ""
    ) -> Response:
        who = admin_page(request, app_name)
        if isinstance(who, Response):
            return who
        target = _weight_of(tenant, weight)
        if isinstance(target, Response):
            return target
        return page(
            request, "weight_confirm.html", who, app=app_name, tenant=tenant, weight=target[1]
        )

    @app.post("/apps/{app_name}/weights/set", include_in_schema=False)
    def weight_act(
        request: Request,
        app_name: str,
        csrf: str = Form(""),
        confirm: str = Form(""),
        tenant: str = Form(""),
        weight: str = Form(""),
    ) -> Response:
        who = admin_post(request, app_name, csrf, confirm)
        if isinstance(who, Response):
            return who
        target = _weight_of(tenant, weight)
        if isinstance(target, Response):
            return target
        try:
            q.set_weight(app_name, target[0], target[1])
        except InvalidArgument as err:
            return _bad_request(str(err))
        board.forget()
        who_is = f"tenant {tenant}" if tenant else "the app's default"
        note = f"weight of {who_is} set to {target[1]:g}"
        where = f"/apps/{quote(app_name, safe='')}/fairness?" + urlencode({"done": note})
        return RedirectResponse(where, 303)


def _page_size(section: str, search: str, limit: str) -> int:
    """Rows a section shows: ``limit`` (checked digits), or 10 a section on the first
    page, 50 on a page of one section."""
    if limit:
        return int(limit)
    return fairness.FIRST if not (section or search) else fairness.PAGE


def _app_pauses(q: Quick, app: str) -> list[Pause]:
    """The pauses of the whole app or of a job type of it, and of every app (the cached
    lookups a visit takes): tenants' own pauses are the view's paused section."""
    found = PauseSet(q.pauses.app_part("").pauses + q.pauses.app_part(app).pauses)
    return [p for p in found.pauses if p.tenant is None]


def _weight_of(tenant: str, weight: str) -> tuple[str | None, float] | Response:
    """The tenant (empty: the app's default) and weight a control names, or the 400 that
    says what is wrong; the store's own checks (positive, finite, bounded) come after."""
    try:
        value = float(weight)
        if tenant:
            check_name("tenant", tenant)
    except (ValueError, InvalidArgument) as err:
        return _bad_request(f"weight must be a number and tenant a name: {err}")
    return (tenant or None, value)


def _pause_of(action: str, app: str, tenant: str, job_type: str) -> Pause | Response:
    """The pause a control names (the app, a tenant, a job type, or both), or the 400
    that says what is wrong with it; nothing is changed before this is checked."""
    if action not in _ACTIONS:
        return _bad_request(f"unknown action {action!r}: pause or resume")
    try:
        return Pause.of(app, tenant or None, job_type or None)
    except InvalidArgument as err:
        return _bad_request(str(err))


def _bad_request(detail: str) -> Response:
    return JSONResponse({"error": "bad_request", "detail": detail}, 400)

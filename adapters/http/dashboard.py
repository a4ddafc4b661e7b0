"""The dashboard: server-rendered pages (Jinja2 templates and one small script shipped as
package data, nothing built or downloaded) over the same reads as the admin API.

Sign-in takes an admin token (or a read-only ``view`` token) once and keeps it in an
HttpOnly, SameSite=Strict cookie. Every action that changes data needs the admin role: a
view token is shown no control, and its confirmation pages and POSTs are refused. Every
such action is a POST that carries a CSRF token (an HMAC of the session's token id under a
per-process secret) and follows a confirmation page. Pages
refresh their live region by polling (``static/live.js``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from quickzones.adapters.http import views
from quickzones.adapters.http.api import ServeState
from quickzones.adapters.http.fairness_pages import mount_fairness_pages
from quickzones.adapters.http.limits_pages import mount_limits_pages
from quickzones.adapters.http.stuck_pages import mount_stuck_pages
from quickzones.adapters.http.tokens import TokenInfo
from quickzones.clock import now_ms
from quickzones.explain import explain
from quickzones.store import admin
from quickzones.store.validation import check_name

_HERE = Path(__file__).parent
COOKIE = "quick_session"
_PAGE = 50


@dataclass(slots=True)
class _Cached:
    at: float
    value: Any
    cost: float = 0.0  # seconds it took to compute


# Entries the pages' cache keeps, the least recently used dropped first: one per app's
# figures, per search of an app's tenants and the like. A search is any text a visitor
# types, so without a bound each one kept its list of tenants for the process's life
# (+28 MB over 4,000 searches, issue 41 point 14).
CACHE_MAX = 256


class Dashboard:
    """The pages' shared state: the store, a CSRF secret, a short cache of whole-store
    figures (so many open dashboards cost one scan per few seconds; at most
    ``CACHE_MAX`` entries, least recently used dropped first), and a history of samples
    for the overview's rates."""

    def __init__(self, state: ServeState) -> None:
        self.state = state
        self.secret = secrets.token_bytes(32)
        self.cache: OrderedDict[str, _Cached] = OrderedDict()
        self.lock = threading.Lock()
        self.refreshing: set[str] = set()
        self.history: list[dict[str, Any]] = []

    def csrf(self, who: TokenInfo) -> str:
        return hmac.new(self.secret, who.token_id.encode(), hashlib.sha256).hexdigest()

    def check_csrf(self, who: TokenInfo, given: str) -> bool:
        return hmac.compare_digest(self.csrf(who), given)

    def cached(self, key: str, ttl_s: float, compute: Any) -> Any:
        """``compute()``, at most once per ``ttl_s`` (or five times its own duration, if
        longer) per key. Stale while revalidating: past its age a value is still served
        while one background thread computes the next, so with 100,000 zones a page
        costs a dictionary lookup, not a scan, after its first load."""
        with self.lock:
            hit = self.cache.get(key)
            now = time.monotonic()
            if hit is not None:
                self.cache.move_to_end(key)  # recently used: the last to go
                fresh = now - hit.at < max(ttl_s, 5 * hit.cost)
                if not fresh and key not in self.refreshing:
                    self.refreshing.add(key)
                    threading.Thread(target=self._refresh, args=(key, compute), daemon=True).start()
                return hit.value
        return self._refresh(key, compute)

    def _refresh(self, key: str, compute: Any) -> Any:
        started = time.monotonic()
        try:
            value = compute()
        finally:
            with self.lock:
                self.refreshing.discard(key)
        with self.lock:
            self.cache[key] = _Cached(time.monotonic(), value, time.monotonic() - started)
            self.cache.move_to_end(key)
            while len(self.cache) > CACHE_MAX:
                self.cache.popitem(last=False)
        return value

    def forget(self) -> None:
        with self.lock:
            self.cache.clear()

    def apps_of(self, who: TokenInfo) -> list[str]:
        if not who.all_apps:
            return [who.app]
        q = self.state.q
        return sorted(self.cached("apps", 2.0, lambda: views.all_apps(q)))

    def overview(self, who: TokenInfo) -> dict[str, Any]:
        q = self.state.q
        rows = []
        for app in self.apps_of(who):
            figures = self.cached(f"app:{app}", 2.0, lambda a=app: _app_row(q, a))
            rows.append(figures)
        now = now_ms(q.clock)
        totals = {
            k: sum(r[k] for r in rows) for k in ("items", "vested", "leased", "dead", "zones")
        }
        for k in ("items", "zones", "dead"):  # a figure of a bounded scan is "at least"
            totals[f"{k}_exact"] = all(r[f"{k}_exact"] for r in rows)
        oldest = [r["oldest_vested_ms"] for r in rows if r["oldest_vested_ms"] is not None]
        totals["oldest_vested_age_s"] = round((now - min(oldest)) / 1000, 1) if oldest else 0
        pulled = self.state.leaser.leased_total
        self.history.append({"t": time.time(), "items": totals["items"], "pulled": pulled})
        del self.history[:-120]
        totals["pulled_per_min"] = _rate(self.history, "pulled")
        totals["pickup_p50_ms"], totals["pickup_p99_ms"] = self.state.leaser.pickup_percentiles()
        return {"apps": rows, "totals": totals, "history": self.history[-30:]}


def _app_row(q: Any, app: str) -> dict[str, Any]:
    """An app's row of the first page: bounded reads (:func:`views.app_figures`,
    :func:`views.active_zone_count`, the dead-letter counter), each figure with whether it
    is whole (``*_exact``), so the page costs the same at a million tenants."""
    f = views.app_figures(q, app)
    zones, zones_exact = views.active_zone_count(q, app)
    dead = views.dead_letter_total(q, app)
    return {
        "app": app,
        "items": f.items,
        "vested": f.vested,
        "leased": f.leased,
        "zones": zones,
        "dead": dead.count,
        "oldest_vested_ms": f.oldest_vested_ms,
        "items_exact": f.exact,
        "zones_exact": zones_exact,
        "dead_exact": dead.exact,
    }


def _rate(history: list[dict[str, Any]], key: str) -> float:
    """Per minute, over the samples of the last five minutes."""
    recent = [h for h in history if h["t"] >= time.time() - 300]
    if len(recent) < 2 or recent[-1]["t"] == recent[0]["t"]:
        return 0.0
    span = float(recent[-1]["t"] - recent[0]["t"])
    change = float(recent[-1][key] - recent[0][key])
    return round(change * 60 / span, 1)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def mount_dashboard(app: FastAPI, state: ServeState) -> None:
    """Add the dashboard's pages (``/``, ``/apps/...`` with its running items, failed
    runs and dead-letter groups, ``/shards``, ``/workers``, ``/login``) to ``app``."""
    board = Dashboard(state)
    app.state.dashboard = board  # for a look at its cache
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.globals["when"] = _when
    templates.env.filters["q"] = lambda v: quote(str(v), safe="")
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")

    def session(request: Request) -> TokenInfo | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        info = state.tokens.check(token)
        if info is None or not _may_sign_in(info):
            return None
        return info

    def read_only(request: Request, who: TokenInfo) -> Response | None:
        """The 403 page for a view token at a control (None for an admin)."""
        if who.has_role("admin"):
            return None
        return templates.TemplateResponse(
            request,
            "error.html",
            {"message": "this token may view, not act: acting needs the admin role", "who": who},
            status_code=403,
            headers=_SECURE_HEADERS,
        )

    def page(request: Request, name: str, who: TokenInfo, **context: Any) -> HTMLResponse:
        context.update(who=who, csrf=board.csrf(who), apps=board.apps_of(who))
        context.setdefault("now_ms", now_ms(state.q.clock))
        partial = request.headers.get("x-live") == "1"
        response = templates.TemplateResponse(
            request, name, {**context, "partial": partial}, headers=_SECURE_HEADERS
        )
        return response

    def login_redirect(request: Request) -> RedirectResponse:
        return RedirectResponse("/login?" + urlencode({"next": request.url.path}), 303)

    def forbidden(request: Request, who: TokenInfo, app: str) -> HTMLResponse | None:
        if who.allows_app(app):
            return None
        return templates.TemplateResponse(
            request,
            "error.html",
            {"message": f"this token is for app {who.app!r}, not {app!r}", "who": who},
            status_code=403,
            headers=_SECURE_HEADERS,
        )

    def admit(request: Request, app: str) -> tuple[TokenInfo | None, Response | None]:
        """The signed-in admin allowed on ``app``, or the response that refuses: the
        sign-in page when not signed in, a 403 page for another app's token."""
        who = session(request)
        if who is None:
            return None, login_redirect(request)
        return who, forbidden(request, who, app)

    # The one guard of every control that changes data (dead letters here, pauses and
    # weights in fairness_pages.py, named limits in limits_pages.py): its confirmation
    # page, then its POST.
    def admin_page(request: Request, app_name: str) -> TokenInfo | Response:
        """The signed-in admin of ``app_name`` a confirmation page is for, or the answer
        that refuses it (sign in, another app's token, a view token)."""
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        return read_only(request, who) or who

    def admin_post(
        request: Request, app_name: str, csrf: str, confirm: str
    ) -> TokenInfo | Response:
        """The admin of ``app_name`` a control's POST comes from, with the session's CSRF
        token and its confirmation page's "yes", or the answer that refuses it; nothing is
        changed before this is checked."""
        who = session(request)
        if who is None:
            return JSONResponse({"error": "unauthenticated"}, 401)
        if not board.check_csrf(who, csrf):
            return _bad_csrf()
        refused = forbidden(request, who, app_name) or read_only(request, who)
        if refused is not None:
            return refused
        if confirm != "yes":
            return _bad_request("confirm the action on its confirmation page")
        return who

    @app.get("/login", include_in_schema=False)
    def login_form(request: Request, next: str = "/") -> HTMLResponse:
        return templates.TemplateResponse(
            request, "login.html", {"next": _local(next), "error": None}, headers=_SECURE_HEADERS
        )

    @app.post("/login", include_in_schema=False)
    def login(
        request: Request, token: str = Form(..., max_length=300), next: str = Form("/")
    ) -> Response:
        info = state.tokens.check(token.strip())
        if info is None or not _may_sign_in(info):
            return templates.TemplateResponse(
                request,
                "login.html",
                {"next": _local(next), "error": "not a valid admin or view token"},
                status_code=401,
                headers=_SECURE_HEADERS,
            )
        response = RedirectResponse(_local(next), 303)
        response.set_cookie(
            COOKIE,
            token.strip(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @app.post("/logout", include_in_schema=False)
    def logout(request: Request, csrf: str = Form("")) -> Response:
        who = session(request)
        if who is not None and not board.check_csrf(who, csrf):
            return _bad_csrf()
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", include_in_schema=False)
    def overview(request: Request) -> Response:
        who = session(request)
        if who is None:
            return login_redirect(request)
        return page(
            request, "overview.html", who, data=board.overview(who),
            scan_limit=views.SCAN_KEYS, zone_limit=views.ZONE_KEYS,
        )  # fmt: skip

    @app.get("/overview.json", include_in_schema=False)
    def overview_json(request: Request) -> Response:
        who = session(request)
        if who is None:
            return JSONResponse({"error": "unauthenticated"}, 401)
        return JSONResponse(board.overview(who), headers=_SECURE_HEADERS)

    @app.get("/apps/{app_name}", include_in_schema=False)
    def app_page(request: Request, app_name: str, search: str = "", cursor: str = "") -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        # One page read from its cursor, whatever the app's other zones: no total. Kept
        # 3 s (the page's live refresh) in the bounded cache.
        key = f"tenants:{app_name}:{search}" + (f":{cursor}" if cursor else "")
        zones, next_cursor = board.cached(
            key,
            3.0,
            lambda: views.zone_depth_page(
                state.q, app_name, search=search or None, limit=_PAGE, cursor=cursor or None
            ),
        )
        return page(
            request, "app.html", who, app=app_name, zones=zones, search=search,
            cursor=cursor, next_cursor=next_cursor,
        )  # fmt: skip

    @app.get("/apps/{app_name}/tenants/{tenant}", include_in_schema=False)
    def zone_page(request: Request, app_name: str, tenant: str, cursor: str = "") -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        zone = state.q.zone(app_name, tenant)
        # A page reads the items it shows from its cursor; the count is the zone's counter.
        total, items = admin.zone_item_page(state.q, zone, limit=_PAGE, cursor=cursor or None)
        now = now_ms(state.q.clock)
        # An item parked behind its one-at-a-time key's holder is not runnable, whatever
        # its vesting time says: it waits (the page's keys read once or twice each).
        turns = admin.key_turns(state.q, zone, items.rows)
        rows = []
        for i in items.rows:
            turn = turns.get(i.item_id)
            parked = turn is not None and turn.holder is not None
            rows.append((i, "waiting" if parked else views.item_state(i, now), turn))
        return page(
            request, "zone.html", who, app=app_name, tenant=tenant, items=rows, total=total,
            cursor=cursor, next_cursor=items.next_cursor,
        )  # fmt: skip

    @app.get("/apps/{app_name}/tenants/{tenant}/items/{item_id}", include_in_schema=False)
    def item_page(request: Request, app_name: str, tenant: str, item_id: str) -> Response:
        """One item: its record and why it has not started (quickzones.explain)."""
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        item = state.q.get(app_name, tenant, item_id)
        why = explain(state.q, app_name, tenant, item_id)
        return page(request, "item.html", who, app=app_name, tenant=tenant, item=item,
                    item_id=item_id, why=why)  # fmt: skip

    @app.get("/apps/{app_name}/dead-letters", include_in_schema=False)
    def dead_letters_page(
        request: Request, app_name: str, tenant: str = "", job_type: str = "", cursor: str = ""
    ) -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        # One page read from its cursor, whatever lies behind it; no total (it would read
        # every letter): the pager says whether more follow.
        letters = admin.dead_letter_page(
            state.q, app_name, tenant or None, job_type=job_type or None, limit=_PAGE,
            cursor=cursor or None,
        )  # fmt: skip
        return page(
            request, "dead_letters.html", who, app=app_name, letters=letters.rows,
            tenant=tenant, job_type=job_type, cursor=cursor, next_cursor=letters.next_cursor,
        )  # fmt: skip

    @app.get("/apps/{app_name}/dead-letters/confirm", include_in_schema=False)
    def confirm_page(
        request: Request,
        app_name: str,
        action: str,
        tenant: str = "",
        job_type: str = "",
        item_id: str = "",
    ) -> Response:
        who = admin_page(request, app_name)
        if isinstance(who, Response):
            return who
        if action not in ("requeue", "purge"):
            return _bad_request(f"unknown action {action!r}")
        # The first 20 and whether more follow: not a count of them all (a scan).
        letters = views.dead_letters(
            state.q, app_name, tenant=tenant or None, job_type=job_type or None,
            item_id=item_id or None, limit=21,
        )  # fmt: skip
        return page(
            request, "confirm.html", who, app=app_name, action=action, letters=letters[:20],
            more=len(letters) > 20, tenant=tenant, job_type=job_type, item_id=item_id,
        )  # fmt: skip

    @app.post("/apps/{app_name}/dead-letters/{action}", include_in_schema=False)
    def act(
        request: Request,
        app_name: str,
        action: str,
        csrf: str = Form(""),
        confirm: str = Form(""),
        tenant: str = Form(""),
        job_type: str = Form(""),
        item_id: str = Form(""),
    ) -> Response:
        who = admin_post(request, app_name, csrf, confirm)
        if isinstance(who, Response):
            return who
        if action not in ("requeue", "purge"):
            return _bad_request("confirm the action on its confirmation page")
        letters = views.dead_letters(
            state.q, app_name, tenant=tenant or None, job_type=job_type or None,
            item_id=item_id or None,
        )  # fmt: skip
        done = skipped = 0
        if action == "purge":
            done = admin.purge(state.q, letters)
        else:
            moved = admin.requeue(state.q, letters)
            done, skipped = moved.requeued, len(moved.kept) + len(moved.corrupt) + moved.gone
        board.forget()
        note = f"{action}d {done}" + (f", skipped {skipped}" if skipped else "")
        target = f"/apps/{quote(app_name, safe='')}/dead-letters?" + urlencode({"done": note})
        return RedirectResponse(target, 303)

    mount_fairness_pages(
        app, board, session=session, page=page, admit=admit, admin_page=admin_page,
        admin_post=admin_post, login_redirect=login_redirect, templates=templates,
    )  # fmt: skip

    mount_stuck_pages(
        app, board, page=page, admit=admit, admin_page=admin_page, admin_post=admin_post
    )
    mount_limits_pages(
        app, board, page=page, admit=admit, admin_page=admin_page, admin_post=admin_post
    )

    @app.get("/shards", include_in_schema=False)
    def shards_page(request: Request) -> Response:
        who = session(request)
        if who is None:
            return login_redirect(request)
        if not who.all_apps:
            return templates.TemplateResponse(
                request,
                "error.html",
                {"message": "pointers of every app need a token for every app", "who": who},
                status_code=403,
                headers=_SECURE_HEADERS,
            )
        return page(
            request, "shards.html", who, cluster=state.q.toplevel.cluster,
            shards=board.cached("shards", 2.0, lambda: views.pointers_by_shard(state.q)),
        )  # fmt: skip


_SECURE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _may_sign_in(info: TokenInfo) -> bool:
    return info.has_role("admin") or info.has_role("view")


def _local(target: str) -> str:
    """Only same-site paths after sign-in (no open redirect)."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _bad_csrf() -> Response:
    return JSONResponse({"error": "csrf", "detail": "missing or wrong CSRF token"}, 403)


def _bad_request(detail: str) -> Response:
    return JSONResponse({"error": "bad_request", "detail": detail}, 400)

"""The dashboard's named limits page (issue 45 point 2): an app's limits (concurrency,
per tenant, rate) with the slots held now and by whom, and, for an admin of the app, a
form that changes, declares or removes one. Mounted by
:func:`quickzones.adapters.http.dashboard.mount_dashboard` with its session and page
helpers, so it keeps its rules (signed in, scoped to the token's apps; a change an admin's
POST with the session's CSRF token after its confirmation page, a view token shown no
form). A change is :meth:`Quick.set_limit` or :meth:`Quick.delete_limit`, the calls of
``PUT``/``DELETE /v1/apps/{app}/limits/{name}`` and ``quick limits``: every consumer
obeys it within about a second.

It reads the app's limits (one small record each), each limit's total holders (one slot
record per consumer holding some) and one page of the app's slot records, tenants' shares
included, from a cursor: never every tenant's."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import RedirectResponse, Response

from quickzones.errors import InvalidArgument
from quickzones.store.limits import Holding
from quickzones.store.named_limits import SCOPE, Limit, check_limit_name
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.adapters.http.dashboard import Dashboard
    from quickzones.adapters.http.tokens import TokenInfo
    from quickzones.client import Quick

_PAGE = 50
_ACTIONS = ("set", "remove")
_FIELD = 200  # characters a form field may hold (a limit name's most, and far past a number's)
# A rate as the form takes it: "10" (a second), "10/s", "10/60s", "30/min", "600/h".
_RATE = re.compile(r"([0-9]+)(?:\s*/\s*(?:([0-9]+(?:\.[0-9]+)?)\s*)?(s|min|h))?")
_UNIT_S = {"s": 1.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class LimitRow:
    """One limit and what its total holds now."""

    limit: Limit
    held: int  # slots held now against the total (all tenants)
    holders: dict[str, int] = field(default_factory=dict)  # consumer -> its slots
    next_start_ms: int | None = None  # the rate's next start (None: one is allowed now)

    @property
    def full(self) -> bool:
        return self.limit.concurrency is not None and self.held >= self.limit.concurrency


@dataclass(frozen=True, slots=True)
class LimitForm:
    """The form's fields as typed (text), so a refused one is shown again to correct;
    ``new``: it declares a limit rather than changing one the app has."""

    name: str = ""
    concurrency: str = ""
    per_tenant: str = ""
    rate: str = ""
    new: bool = True

    @staticmethod
    def of(limit: Limit) -> LimitForm:
        """The form filled with ``limit`` as it is (its row's "change…")."""
        return LimitForm(limit.name, _text(limit.concurrency), _text(limit.per_tenant),
                         rate_text(limit), new=False)  # fmt: skip

    def limit(self, app: str) -> Limit:
        """The limit the fields describe, checked as :meth:`Quick.set_limit` checks it;
        :class:`InvalidArgument` names the field at fault."""
        rate, per = parse_rate(self.rate)
        return Limit.of(
            app, self.name, concurrency=_count("concurrency", self.concurrency),
            per_tenant=_count("per_tenant", self.per_tenant), rate=rate, per=per,
        )  # fmt: skip


class FormError(ValueError):
    """A form that names a limit the app does not have, or declares one it has."""


def rate_text(limit: Limit) -> str:
    """A limit's rate in the form's syntax ("" when it has none)."""
    if limit.rate is None:
        return ""
    if limit.per_s == 1:
        return f"{limit.rate}/s"
    per = repr(limit.per_s)  # every digit: a change of another field keeps the period
    return f"{limit.rate}/{per.removesuffix('.0')}s"


def parse_rate(text: str) -> tuple[int | None, float]:
    """``rate`` and ``per`` (seconds) of the form's rate: empty (no rate), ``N`` (a
    second), ``N/s``, ``N/60s``, ``N/min``, ``N/2h``."""
    text = text.strip()
    if not text:
        return None, 1.0
    found = _RATE.fullmatch(text)
    if found is None:
        raise InvalidArgument(
            "rate", text, "write starts per period: 10/s, 10/60s, 30/min or 600/h"
        )
    count, periods, unit = found.groups()
    return int(count), float(periods or 1) * _UNIT_S[unit or "s"]


def _count(name: str, text: str) -> int | None:
    """A whole number typed in a field, or None when left empty; its range is
    :meth:`Limit.of`'s to check (so a negative one is refused by the same words)."""
    text = text.strip()
    if not text:
        return None
    if re.fullmatch(r"-?[0-9]+", text) is None:
        raise InvalidArgument(name, text, "must be a whole number")
    return int(text)


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def limit_rows(q: Quick, app: str) -> list[LimitRow]:
    """The app's limits, each with its total's holders now (snapshot reads)."""
    rows = []
    for lim in q.list_limits(app):
        holders = q.limits.slots_held(SCOPE, lim.total_name())
        nxt = None
        if lim.rate is not None:
            nxt = q.limits.next_start_ms(lim.total_name(), lim.rate, lim.per_ms)
        rows.append(LimitRow(lim, sum(holders.values()), dict(sorted(holders.items())), nxt))
    return rows


def holdings(q: Quick, app: str, cursor: str | None) -> tuple[list[Holding], str | None]:
    """One page of the slots held now of the app's limits: totals and tenants' shares,
    each with its consumer (quick serve's for remote workers' runs)."""
    return q.limits.holdings_page(SCOPE, (app,), limit=_PAGE, cursor=cursor)


def existing(q: Quick, app: str, name: str) -> Limit:
    """The app's limit ``name`` as stored now; :class:`FormError` when it has none."""
    found = q.get_limit(app, check_limit_name(name))
    if found is None:
        raise FormError(f"app {app} has no limit {name!r} (removed meanwhile?)")
    return found


def checked(q: Quick, app: str, form: LimitForm) -> tuple[Limit, Limit | None]:
    """The limit a set form asks for and the one it replaces (None: declared), or the
    error that says what is wrong with it; nothing is changed."""
    wanted = form.limit(app)
    if form.new:
        was = q.get_limit(app, wanted.name)
        if was is not None:
            raise FormError(f"app {app} has limit {wanted.name!r} already: change it from its row")
        return wanted, None
    return wanted, existing(q, app, wanted.name)


def mount_limits_pages(
    app: FastAPI,
    board: Dashboard,
    *,
    page: Callable[..., Response],
    admit: Callable[[Request, str], tuple[TokenInfo | None, Response | None]],
    admin_page: Callable[[Request, str], TokenInfo | Response],
    admin_post: Callable[[Request, str, str, str], TokenInfo | Response],
) -> None:
    """``admin_page`` and ``admin_post``: the dashboard's one guard of every control
    (admin role, CSRF token, confirmation), written in ``mount_dashboard``."""
    q = board.state.q

    def limits_view(
        request: Request,
        who: TokenInfo,
        app_name: str,
        *,
        cursor: str = "",
        done: str = "",
        form: LimitForm | None = None,
        error: str | None = None,
    ) -> Response:
        """The page, with the form (an admin's) and the error that refused it, if any:
        a refused change is a 400 that shows the page again, the form as it was typed."""
        check_name("app", app_name)
        held, next_cursor = holdings(q, app_name, cursor or None)  # a bad cursor: 400
        shown = page(
            request, "limits.html", who, app=app_name, limits=limit_rows(q, app_name),
            held=held, cursor=cursor, next_cursor=next_cursor, done=done,
            form=form or LimitForm(), error=error,
        )  # fmt: skip
        if error is not None:
            shown.status_code = 400
        return shown

    @app.get("/apps/{app_name}/limits", include_in_schema=False)
    def limits_page(
        request: Request, app_name: str, cursor: str = "", done: str = "", edit: str = ""
    ) -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        if edit and who.has_role("admin"):
            try:
                form = LimitForm.of(existing(q, app_name, edit))
            except (InvalidArgument, FormError) as err:
                return limits_view(request, who, app_name, cursor=cursor, error=str(err))
            return limits_view(request, who, app_name, cursor=cursor, done=done, form=form)
        return limits_view(request, who, app_name, cursor=cursor, done=done)

    @app.get("/apps/{app_name}/limits/confirm", include_in_schema=False)
    def limit_confirm(
        request: Request,
        app_name: str,
        action: str = "",
        name: str = "",
        concurrency: str = "",
        per_tenant: str = "",
        rate: str = "",
        new: str = "",
    ) -> Response:
        who = admin_page(request, app_name)
        if isinstance(who, Response):
            return who
        form = LimitForm(name, concurrency, per_tenant, rate, new == "yes")
        try:
            if action == "set":
                wanted, was = checked(q, app_name, form)
            elif action == "remove":
                wanted, was = existing(q, app_name, name), None
            else:
                raise FormError(f"unknown action {action!r}: set or remove")
        except (InvalidArgument, FormError) as err:
            return limits_view(request, who, app_name, form=form, error=str(err))
        return page(
            request, "limits_confirm.html", who, app=app_name, action=action, form=form,
            wanted=wanted, was=was,
        )  # fmt: skip

    @app.post("/apps/{app_name}/limits/{action}", include_in_schema=False)
    def limit_act(
        request: Request,
        app_name: str,
        action: str,
        csrf: str = Form(""),
        confirm: str = Form(""),
        name: str = Form("", max_length=_FIELD),
        concurrency: str = Form("", max_length=_FIELD),
        per_tenant: str = Form("", max_length=_FIELD),
        rate: str = Form("", max_length=_FIELD),
        new: str = Form(""),
    ) -> Response:
        who = admin_post(request, app_name, csrf, confirm)
        if isinstance(who, Response):
            return who
        form = LimitForm(name, concurrency, per_tenant, rate, new == "yes")
        try:
            if action == "set":
                wanted, was = checked(q, app_name, form)
                # The call PUT /v1/apps/{app}/limits/{name} and `quick limits set` make.
                q.set_limit(
                    app_name, wanted.name, concurrency=wanted.concurrency,
                    per_tenant=wanted.per_tenant, rate=wanted.rate, per=wanted.per_s,
                )  # fmt: skip
                note = f"{'set' if was else 'declared'} {wanted.describe()}"
            elif action == "remove":
                if not q.delete_limit(app_name, check_limit_name(name)):
                    raise FormError(f"app {app_name} has no limit {name!r} (removed meanwhile?)")
                note = f"removed limit {name}: job types naming it hold their items back"
            else:
                raise FormError(f"unknown action {action!r}: set or remove")
        except (InvalidArgument, FormError) as err:
            return limits_view(request, who, app_name, form=form, error=str(err))
        board.forget()
        where = f"/apps/{quote(app_name, safe='')}/limits?" + urlencode({"done": note})
        return RedirectResponse(where, 303)

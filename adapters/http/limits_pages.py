"""The dashboard's named limits page (issue 45 point 2): an app's limits (concurrency,
per tenant, rate) with the slots held now and by whom. Mounted by
:func:`quickzones.adapters.http.dashboard.mount_dashboard` with its session and page
helpers, so it keeps its rules (signed in, scoped to the token's apps).

It reads the app's limits (one small record each), each limit's total holders (one slot
record per consumer holding some) and one page of the app's slot records, tenants' shares
included, from a cursor: never every tenant's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response

from quickzones.store.limits import Holding
from quickzones.store.named_limits import SCOPE, Limit
from quickzones.store.validation import check_name

if TYPE_CHECKING:
    from quickzones.adapters.http.dashboard import Dashboard
    from quickzones.adapters.http.tokens import TokenInfo
    from quickzones.client import Quick

_PAGE = 50


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


def mount_limits_pages(
    app: FastAPI,
    board: Dashboard,
    *,
    page: Callable[..., Response],
    admit: Callable[[Request, str], tuple[TokenInfo | None, Response | None]],
) -> None:
    q = board.state.q

    @app.get("/apps/{app_name}/limits", include_in_schema=False)
    def limits_page(request: Request, app_name: str, cursor: str = "") -> Response:
        who, refused = admit(request, app_name)
        if refused is not None:
            return refused
        assert who is not None
        check_name("app", app_name)
        held, next_cursor = holdings(q, app_name, cursor or None)  # a bad cursor: 400
        return page(
            request, "limits.html", who, app=app_name, limits=limit_rows(q, app_name),
            held=held, cursor=cursor, next_cursor=next_cursor,
        )  # fmt: skip

"""``quick weight set|show|clear`` and ``quick limit set|show|clear``: tenant weights and
per-tenant limits on every consumer (:mod:`quickzones.store.weights`,
:mod:`quickzones.store.tenant_limits`, docs/fairness.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from quickzones.cli.group import main
from quickzones.cli.options import (
    echo_next_cursor,
    friendly,
    open_store,
    page_options,
    read_listing,
    store_option,
)
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.weights import TenantWeight


@main.group("weight")
def weight_group() -> None:
    """Tenant weights: where tenants contend, one of weight w starts w times as many
    items as one of weight 1."""


_app = click.option("--app", required=True, help="The app.")
_tenant = click.option(
    "--tenant", default=None, help="A tenant of --app (without it: the app's default weight)."
)


@weight_group.command("set")
@store_option
@_app
@_tenant
@click.argument("weight", type=float)
@friendly
def weight_set(store: str, app: str, tenant: str | None, weight: float) -> None:
    """Give a tenant (or every tenant of the app without its own) WEIGHT, from 0.001 to
    1000; every consumer uses it within about a second."""
    with open_store(store, create=False) as q:
        w = q.set_weight(app, tenant, weight)
    click.echo(f"set {w.describe()}")


@weight_group.command("clear")
@store_option
@_app
@_tenant
@friendly
def weight_clear(store: str, app: str, tenant: str | None) -> None:
    """Drop the weight named exactly so (exit status 1 when there was none)."""
    with open_store(store, create=False) as q:
        dropped = q.clear_weight(app, tenant)
    _cleared(f"app={app}" + ("" if tenant is None else f" tenant={tenant}"), dropped, "weight")


@weight_group.command("show")
@store_option
@click.option("--app", default=None, help="Only this app's weights.")
@page_options("weights")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def weight_show(
    store: str, app: str | None, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """Every stored weight (of --app), by app and tenant; tenants without one weigh
    their app's default, or 1."""
    with open_store(store, create=False) as q:
        weights, next_cursor = read_listing(
            lambda **page: q.weight_page(app, **page), limit, cursor
        )
    echo_next_cursor(next_cursor)
    _show(weights, as_json, weight_json, "no weights: every tenant weighs 1")


def weight_json(w: TenantWeight) -> dict[str, Any]:
    return {"app": w.app, "tenant": w.tenant, "weight": w.weight}


@main.group("limit")
def limit_group() -> None:
    """Per-tenant limits: items running at once, starts per period, across every
    consumer."""


_limit_tenant = click.option("--tenant", required=True, help="A tenant of --app.")
_job_type = click.option(
    "--job-type", default=None, help="Only its items of this job type (default: all)."
)


@limit_group.command("set")
@store_option
@_app
@_limit_tenant
@_job_type
@click.option("--max-running", type=int, default=None, help="Items running at once.")
@click.option("--rate", type=int, default=None, help="Starts per --per seconds.")
@click.option("--per", type=float, default=1.0, show_default=True, help="The rate's period (s).")
@friendly
def limit_set(
    store: str,
    app: str,
    tenant: str,
    job_type: str | None,
    max_running: int | None,
    rate: int | None,
    per: float,
) -> None:
    """Limit a tenant (or its items of one job type), replacing its earlier limit; what
    is held back waits, counting no attempt."""
    with open_store(store, create=False) as q:
        limit = q.set_tenant_limit(
            app, tenant, job_type, max_running=max_running, rate=rate, per=per
        )
    click.echo(f"set {limit.describe()}")


@limit_group.command("clear")
@store_option
@_app
@_limit_tenant
@_job_type
@friendly
def limit_clear(store: str, app: str, tenant: str, job_type: str | None) -> None:
    """Lift the limit named exactly so (exit status 1 when there was none)."""
    with open_store(store, create=False) as q:
        lifted = q.clear_tenant_limit(app, tenant, job_type)
    who = f"app={app} tenant={tenant}" + ("" if job_type is None else f" job_type={job_type}")
    _cleared(who, lifted, "limit")


@limit_group.command("show")
@store_option
@click.option("--app", default=None, help="Only this app's limits.")
@page_options("limits")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def limit_show(
    store: str, app: str | None, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """Every per-tenant limit in force (of --app), by app, tenant and job type."""
    with open_store(store, create=False) as q:
        limits, next_cursor = read_listing(
            lambda **page: q.tenant_limit_page(app, **page), limit, cursor
        )
    echo_next_cursor(next_cursor)
    _show(limits, as_json, limit_json, "no tenant limits")


def limit_json(limit: TenantLimit) -> dict[str, Any]:
    return limit.as_dict()


def _cleared(who: str, dropped: bool, what: str) -> None:
    """A clear's answer: exit status 1 when there was nothing to clear."""
    if not dropped:
        click.echo(f"{who} had no {what}", err=True)
        sys.exit(1)
    click.echo(f"cleared {who}")


def _show(records: Sequence[Any], as_json: bool, to_json: Callable[[Any], Any], none: str) -> None:
    """A show's answer: one JSON list, or a line each (``none`` when there is none)."""
    if as_json:
        click.echo(json.dumps([to_json(r) for r in records], sort_keys=True))
        return
    if not records:
        click.echo(none)
    for r in records:
        click.echo(r.describe())

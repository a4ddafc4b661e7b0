"""``quick limits set|list|delete``: named limits shared by job types, per app
(:mod:`quickzones.store.named_limits`); every consumer enforces a change within about a
second."""

from __future__ import annotations

import json
import sys

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option

_app = click.option("--app", required=True, help="The app whose limit it is.")


@main.group("limits")
def limits_group() -> None:
    """Named limits: slots shared by the job types that name them (``limits=[...]``),
    in total and per tenant, and starts per period, across every consumer."""


@limits_group.command("set")
@store_option
@_app
@click.argument("name")
@click.option("--concurrency", type=int, default=None, help="Slots held at once, in total.")
@click.option("--per-tenant", type=int, default=None, help="Slots one tenant holds at once.")
@click.option("--rate", type=int, default=None, help="Slots started per --per seconds.")
@click.option("--per", type=float, default=1.0, show_default=True, help="The rate's period (s).")
@friendly
def limits_set(
    store: str,
    app: str,
    name: str,
    concurrency: int | None,
    per_tenant: int | None,
    rate: int | None,
    per: float,
) -> None:
    """Declare or change limit NAME of an app (replacing what it was)."""
    with open_store(store, create=False) as q:
        limit = q.set_limit(
            app, name, concurrency=concurrency, per_tenant=per_tenant, rate=rate, per=per
        )
    click.echo(f"set {limit.describe()}")


@limits_group.command("delete")
@store_option
@_app
@click.argument("name")
@friendly
def limits_delete(store: str, app: str, name: str) -> None:
    """Drop limit NAME of an app (exit status 1 when there was none); job types naming it
    hold their items back until it is declared again."""
    with open_store(store, create=False) as q:
        found = q.delete_limit(app, name)
    if not found:
        click.echo(f"app={app} has no limit {name}", err=True)
        sys.exit(1)
    click.echo(f"deleted app={app} limit={name}")


@limits_group.command("list")
@store_option
@click.option("--app", default=None, help="Only this app's limits.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def limits_list(store: str, app: str | None, as_json: bool) -> None:
    """Every named limit (of --app)."""
    with open_store(store, create=False) as q:
        limits = q.list_limits(app)
    if as_json:
        click.echo(json.dumps([lim.as_dict() for lim in limits], sort_keys=True))
        return
    if not limits:
        click.echo("no named limits")
    for lim in limits:
        click.echo(lim.describe())

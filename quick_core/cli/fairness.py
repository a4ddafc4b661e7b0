"""``quick weight set|show|clear``: tenant weights on every consumer
(:mod:`quickzones.store.weights`, docs/fairness.md)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option
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
    q = open_store(store, create=False)
    try:
        w = q.set_weight(app, tenant, weight)
    finally:
        q.close()
    click.echo(f"set {w.describe()}")


@weight_group.command("clear")
@store_option
@_app
@_tenant
@friendly
def weight_clear(store: str, app: str, tenant: str | None) -> None:
    """Drop the weight named exactly so (exit status 1 when there was none)."""
    q = open_store(store, create=False)
    try:
        dropped = q.clear_weight(app, tenant)
    finally:
        q.close()
    who = f"app={app}" + ("" if tenant is None else f" tenant={tenant}")
    if not dropped:
        click.echo(f"{who} had no weight", err=True)
        sys.exit(1)
    click.echo(f"cleared {who}")


@weight_group.command("show")
@store_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def weight_show(store: str, as_json: bool) -> None:
    """Every stored weight; tenants without one weigh their app's default, or 1."""
    q = open_store(store, create=False)
    try:
        weights = q.weights()
    finally:
        q.close()
    if as_json:
        click.echo(json.dumps([weight_json(w) for w in weights], sort_keys=True))
        return
    if not weights:
        click.echo("no weights: every tenant weighs 1")
    for w in weights:
        click.echo(w.describe())


def weight_json(w: TenantWeight) -> dict[str, Any]:
    return {"app": w.app, "tenant": w.tenant, "weight": w.weight}

"""``quick explain APP TENANT ITEM_ID``: why an item has not started, rule by rule in the
order a consumer applies them (:mod:`quickzones.explain`)."""

from __future__ import annotations

import json

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option
from quickzones.cli.output import when


@main.command("explain")
@store_option
@click.argument("app")
@click.argument("tenant")
@click.argument("item_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (an object).")
@friendly
def explain_command(store: str, app: str, tenant: str, item_id: str, as_json: bool) -> None:
    """Why ITEM_ID has not started: its state, then each rule between it and a worker
    (held back: '!', clear: '-'); the first held one is the one to act on."""
    from quickzones.explain import explain

    with open_store(store, create=False) as q:
        e = explain(q, app, tenant, item_id)
    if as_json:
        click.echo(json.dumps(e.as_dict(), sort_keys=True))
        return
    click.echo(f"{app}/{tenant} item {item_id}: {e.state}")
    click.echo(f"=> {e.summary}")
    for r in e.rules:
        until = "" if r.until_ms is None else f"  (until {when(r.until_ms)})"
        click.echo(f"  {'!' if r.holds else '-'} {r.name:<15} {r.detail}{until}")

"""``quick batch show ID``: a batch's counts, its callback and the items that did not
complete (:mod:`quickzones.store.batches`, docs/batches.md)."""

from __future__ import annotations

import json
import sys

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option


@main.group()
def batch() -> None:
    """Batches enqueued with Quick.enqueue_batch or Quick.chain."""


@batch.command()
@store_option
@click.argument("batch_id")
@click.option("--app", required=True, help="The app the batch was enqueued in.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@friendly
def show(store: str, batch_id: str, app: str, as_json: bool) -> None:
    """Where batch BATCH_ID stands: completed, dead-lettered, cancelled and pending
    items, its callback's id and whether it was enqueued (exit status 1: no such batch)."""
    with open_store(store, create=False) as q:
        status = q.batch_status(app, batch_id)
    if status is None:
        click.echo(f"no batch {batch_id!r} in app {app}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(status.as_dict(), sort_keys=True))
        return
    click.echo(
        f"batch {status.batch_id} in app {status.app}: {status.state}, completed "
        f"{status.completed} of {status.total}, dead-lettered {status.dead_lettered}, "
        f"cancelled {status.cancelled}, pending {status.pending}"
    )
    queued = "enqueued" if status.callback_enqueued else "not yet enqueued"
    click.echo(f"callback {status.callback_id} (tenant {status.callback_tenant}): {queued}")
    for tenant, item_id, state, reason in status.failed:
        click.echo(f"  {state} {tenant}/{item_id}: {reason or ''}")
    more = status.dead_lettered + status.cancelled - len(status.failed)
    if more > 0:
        click.echo(f"  ... and {more} more")

"""``quick dead-letters list|requeue|purge``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from quickzones.cli.group import main
from quickzones.cli.options import (
    echo_next_cursor,
    error_line,
    friendly,
    open_store,
    page_options,
    store_option,
)
from quickzones.cli.output import make_console, make_table, when
from quickzones.errors import QuickError
from quickzones.store.records import DeadLetter


@main.group("dead-letters")
def dead_letters() -> None:
    """List, requeue or purge dead letters."""


def _filters(app: str | None, tenant: str | None) -> tuple[str | None, str | None]:
    from quickzones.store.validation import check_name

    return (
        None if app is None else check_name("app", app),
        None if tenant is None else check_name("tenant", tenant),
    )


def _letter_doc(d: DeadLetter) -> dict[str, Any]:
    """A dead letter as JSON, with stable field names."""
    item = d.item
    doc: dict[str, Any] = {
        "app": d.zone.app,
        "tenant": d.zone.tenant,
        "item_id": d.item_id,
        "reason": d.reason,
        "dead_at_ms": d.dead_at_ms,
        "dead_at": when(d.dead_at_ms),
        "traceback": d.traceback,
        "corrupt": item is None,
        "job_type": None,
        "attempts": None,
        "error_count": None,
        "last_error": None,
        "enqueued_at_ms": None,
        "enqueued_at": None,
        "priority": None,
        "content_type": None,
        "payload_bytes": None,
    }
    if item is not None:
        doc.update(
            job_type=item.job_type,
            attempts=item.attempts,
            error_count=item.error_count,
            last_error=item.last_error,
            enqueued_at_ms=item.enqueued_ms,
            enqueued_at=when(item.enqueued_ms),
            priority=item.priority,
            content_type=item.content_type,
            payload_bytes=len(item.payload),
        )
    return doc


@dead_letters.command("list")
@store_option
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--tenant", default=None, help="Only this tenant's (in every app, or in --app).")
@click.option("--job-type", default=None, help="Only dead letters of this job type.")
@page_options("dead letters")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def dead_letters_list(
    store: str,
    app: str | None,
    tenant: str | None,
    job_type: str | None,
    limit: int | None,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Dead letters: zone, id, job type, attempts, errors, when, reason, traceback."""
    from quickzones.store.admin import dead_letter_page, list_dead_letters

    app, tenant = _filters(app, tenant)
    next_cursor: str | None = None
    with open_store(store, create=False) as q:
        if limit is None and cursor is None:
            letters = list_dead_letters(q, app, tenant, job_type=job_type)
        else:
            page = dead_letter_page(
                q, app, tenant, job_type=job_type, limit=limit or 50, cursor=cursor
            )
            letters, next_cursor = page.rows, page.next_cursor
    echo_next_cursor(next_cursor)
    docs = [_letter_doc(d) for d in letters]
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    columns = ["app", "tenant", "item id", "job type", "attempts", "errors", "dead at (UTC)",
               "reason"]  # fmt: skip
    rows = [
        [
            d["app"],
            d["tenant"],
            d["item_id"],
            d["job_type"] or "(corrupt)",
            "" if d["attempts"] is None else str(d["attempts"]),
            "" if d["error_count"] is None else str(d["error_count"]),
            d["dead_at"],
            d["reason"],
        ]
        for d in docs
    ]
    console = make_console()
    console.print(make_table(f"dead letters ({len(docs)})", columns, rows))
    for d in docs:
        if d["traceback"]:
            console.rule(f"traceback of {d['app']}/{d['tenant']} {d['item_id']}")
            console.print(d["traceback"].rstrip("\n"), markup=False, highlight=False)


_job_type = click.option("--job-type", default=None, help="Only dead letters of this job type.")
_limit = click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="At most this many dead letters."
)


@dead_letters.command("requeue")
@store_option
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--tenant", default=None, help="Only this tenant's (in every app, or in --app).")
@_job_type
@click.option("--id", "item_id", default=None, help="One item (with --app and --tenant).")
@_limit
@friendly
def dead_letters_requeue(
    store: str,
    app: str | None,
    tenant: str | None,
    job_type: str | None,
    item_id: str | None,
    limit: int | None,
) -> None:
    """Put the dead letters ``list`` shows with the same filters back into their zones, in
    bounded transactions. A dead letter whose id is already queued in its zone is kept and
    reported (exit status 2)."""
    from quickzones.errors import ItemAlreadyQueued

    if item_id is not None:
        if app is None or tenant is None or job_type is not None or limit is not None:
            raise click.UsageError("--id names one item: give it with --app and --tenant only")
        q = open_store(store)
        try:
            q.requeue_dead_letter(app, tenant, item_id)
        except ItemAlreadyQueued as err:
            error_line(err)
            sys.exit(2)
        finally:
            q.close()
        click.echo("requeued 1")
        return
    with open_store(store) as q:
        done = q.requeue_dead_letters(app, tenant, job_type=job_type, limit=limit)
    click.echo(f"requeued {done.requeued}")
    if done.corrupt:
        click.echo(f"{len(done.corrupt)} corrupt dead letter(s) left (only purge removes them)",
                   err=True)  # fmt: skip
    if done.kept:
        kept = ", ".join(f"{d.zone}:{d.item_id}" for d in done.kept)
        error_line(
            QuickError(
                f"{len(done.kept)} dead letter(s) kept, their ids are already queued: {kept}"
            )
        )
        sys.exit(2)


@dead_letters.command("purge")
@store_option
@click.option("--app", default=None, help="Only this app's dead letters.")
@click.option("--tenant", default=None, help="Only this tenant's (in every app, or in --app).")
@_job_type
@_limit
@click.option("--yes", is_flag=True, help="Purge every dead letter without asking first.")
@friendly
def dead_letters_purge(
    store: str,
    app: str | None,
    tenant: str | None,
    job_type: str | None,
    limit: int | None,
    yes: bool,
) -> None:
    """Delete exactly the dead letters ``list`` shows with the same filters. Without any
    filter it asks first (or give --yes)."""
    app, tenant = _filters(app, tenant)
    if app is None and tenant is None and job_type is None and not yes:
        click.confirm("Purge every dead letter of every app?", abort=True, err=True)
    with open_store(store) as q:
        click.echo(f"purged {q.purge_dead_letters(app, tenant, job_type=job_type, limit=limit)}")

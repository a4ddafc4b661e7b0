"""``quick pause``, ``quick resume`` and ``quick paused``: hold back an app, a tenant of an
app or a job type on every consumer (:mod:`quickzones.store.pauses`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
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
from quickzones.cli.output import when
from quickzones.store.pauses import Pause


def _target(fn: Callable[..., Any]) -> Callable[..., Any]:
    for flag, what in (
        ("--job-type", "A job type (of --app, or of every app without it)."),
        ("--tenant", "A tenant of --app."),
        ("--app", "An app (alone: every tenant and job type of it)."),
    ):
        fn = click.option(flag, default=None, help=what)(fn)
    return fn


@main.command()
@store_option
@_target
@friendly
def pause(store: str, app: str | None, tenant: str | None, job_type: str | None) -> None:
    """Hold back an app, a tenant or a job type: nothing of it starts (within about a
    second), running items finish, enqueues are still accepted."""
    with open_store(store, create=False) as q:
        p = q.pause(app=app, tenant=tenant, job_type=job_type)
    click.echo(f"paused {p.describe()}")


@main.command()
@store_option
@_target
@friendly
def resume(store: str, app: str | None, tenant: str | None, job_type: str | None) -> None:
    """Lift the pause named exactly so (exit status 1 when there was none)."""
    with open_store(store, create=False) as q:
        lifted = q.resume(app=app, tenant=tenant, job_type=job_type)
    target = Pause.of(app, tenant, job_type).describe()
    if not lifted:
        click.echo(f"{target} was not paused", err=True)
        sys.exit(1)
    click.echo(f"resumed {target}")


@main.command()
@store_option
@click.option("--app", default=None, help="Only what holds back some of this app (its own "
              "pauses and the job types paused in every app).")  # fmt: skip
@page_options("pauses")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list of pauses).")
@friendly
def paused(
    store: str, app: str | None, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """Every pause in force (of --app), by app, tenant and job type."""
    with open_store(store, create=False) as q:
        pauses, next_cursor = read_listing(lambda **page: q.pause_page(app, **page), limit, cursor)
    echo_next_cursor(next_cursor)
    if as_json:
        click.echo(json.dumps([pause_json(p) for p in pauses], sort_keys=True))
        return
    if not pauses:
        click.echo("nothing paused")
    for p in pauses:
        click.echo(f"{p.describe()}  (since {when(p.since_ms)})")


def pause_json(p: Pause) -> dict[str, Any]:
    return {**p.as_dict(), "since": when(p.since_ms) if p.since_ms else None}

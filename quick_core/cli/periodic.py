"""``quick periodic list``: an app module's periodic (cron) schedules."""

from __future__ import annotations

import json
import os
import sys

import click

from quickzones.cli.app_module import load_handlers
from quickzones.cli.group import main
from quickzones.cli.options import friendly
from quickzones.cli.output import make_console, make_table, when, when_in


@main.group("periodic")
def periodic_group() -> None:
    """Periodic (cron) schedules of an app module."""


@periodic_group.command("list")
@click.option("--app-module", "app_module", required=True, help="module[:attr] with a Quick.")
@click.option("--count", type=click.IntRange(min=1, max=100), default=3, show_default=True,
              help="Next runs shown per schedule.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list).")
@friendly
def periodic_list(app_module: str, count: int, as_json: bool) -> None:
    """Each schedule, the last slot enqueued and the next runs (in the schedule's time
    zone, with its UTC offset; --json gives them in UTC too)."""
    sys.path.insert(0, os.getcwd())
    q = load_handlers(app_module)
    try:
        scheduler = q.scheduler()
        docs = [
            {
                "name": s.name,
                "cron": s.cron,
                "tz": s.tz,
                "job_type": s.job_type,
                "app": s.app,
                "tenant": s.tenant,
                "catch_up": s.catch_up,
                "last_enqueued": when(scheduler.last_enqueued(s)),
                "next_runs": [when(ms) for ms in runs],
                "next_runs_local": [when_in(ms, s.tz) for ms in runs],
            }
            for s in q.schedules
            for runs in [scheduler.next_runs(s, count)]
        ]
    finally:
        q.close()
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    rows = [
        [
            str(d["name"]),
            f"{d['cron']} ({d['tz']})",
            f"{d['job_type']} -> {d['app']}/{d['tenant']}",
            str(d["last_enqueued"] or ""),
            ", ".join(str(t) for t in d["next_runs_local"]),
        ]
        for d in docs
    ]
    make_console().print(
        make_table(
            "periodic schedules", ["name", "cron", "job", "last enqueued", "next runs"], rows
        )
    )

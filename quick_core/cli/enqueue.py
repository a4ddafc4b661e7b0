"""``quick enqueue``: one item from the command line."""

from __future__ import annotations

import json
from typing import Any

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option


@main.command()
@store_option
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--job-type", "job_type", required=True)
@click.option("--payload", default="null", help="JSON payload (default null).")
@click.option("--delay", type=float, default=0.0, help="Seconds before the item vests.")
@click.option("--priority", type=int, default=0, help="Lower runs first.")
@click.option("--id", "item_id", default=None, help="Caller-chosen id (idempotent enqueue).")
@click.option(
    "--fifo", is_flag=True, help="Order by commit among the priority's FIFO items (KV zones)."
)
@friendly
def enqueue(
    store: str,
    app: str,
    tenant: str,
    job_type: str,
    payload: str,
    delay: float,
    priority: int,
    item_id: str | None,
    fifo: bool,
) -> None:
    """Enqueue one item and print its id."""
    body = _parse_json("payload", payload)
    with open_store(store) as q:
        click.echo(
            q.enqueue(
                job_type,
                body,
                app=app,
                tenant=tenant,
                delay=delay,
                priority=priority,
                item_id=item_id,
                fifo=fifo,
            )
        )


def _parse_json(name: str, text: str) -> Any:
    from quickzones.errors import InvalidArgument

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidArgument(name, text, f"not JSON: {err.msg}") from None
    except RecursionError:
        raise InvalidArgument(name, text, "JSON nested too deeply") from None
    except ValueError as err:  # an integer over Python's 4,300-digit conversion limit
        raise InvalidArgument(name, text, f"not usable JSON: {err}") from None

"""``quick move-tenant``: one tenant's zone from one KV store to another."""

from __future__ import annotations

import sys

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store


@main.command("move-tenant")
@click.option("--from", "source", required=True, help="Source KV store URL.")
@click.option("--to", "target", required=True, help="Target KV store URL.")
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--include-leased", is_flag=True, help="Take over running items' leases.")
@click.option("--lease-wait", type=float, default=60.0, show_default=True)
@friendly
def move_tenant_cmd(
    source: str, target: str, app: str, tenant: str, include_leased: bool, lease_wait: float
) -> None:
    """Move one tenant's zone between KV stores: zone, then pointer, then remove source."""
    from quickzones.errors import ConfigurationError
    from quickzones.store.tenant_move import move_tenant

    if source == target:
        raise ConfigurationError("--from and --to name the same store")
    src, dst = open_store(source), open_store(target)
    try:
        report = move_tenant(
            src, dst, app, tenant, include_leased=include_leased, lease_wait_s=lease_wait
        )
    finally:
        src.close()
        dst.close()
    click.echo(
        f"{app}/{tenant}: moved {report.moved} (total {report.moved_total}), "
        f"source {report.source_before} -> {report.source_after}, "
        f"leased left {report.skipped_leased}"
    )
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    sys.exit(0 if report.ok else 1)

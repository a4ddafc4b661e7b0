"""The Cassandra adapter's ``quick`` commands: ``quick cassandra init|repair`` and
``quick migrate`` (open both sides, show a progress bar, report counts).

The adapter owns them: ``pyproject.toml`` registers them in the ``quickzones.cli`` entry
point group, and the core's ``quick`` group loads them only when listed or run (the core
never imports an adapter). They use the core's builders, :func:`quickzones.cli.friendly`.
"""

from __future__ import annotations

import sys
import threading

import click

from quickzones.adapters.cassandra.driver import connect
from quickzones.adapters.cassandra.migrate import migrate
from quickzones.adapters.cassandra.store import CassandraZoneStore
from quickzones.adapters.cassandra.url import parse_cassandra_url
from quickzones.cli import friendly
from quickzones.client import Quick
from quickzones.errors import ConfigurationError
from quickzones.store.tenant_move import MoveReport


def run_migrate(
    source: str,
    target: str,
    *,
    pointer_store: str | None,
    app: str | None,
    tenant: str | None,
    dry_run: bool,
    resume: bool,
    include_leased: bool,
    lease_wait_s: float,
    workers: int,
) -> bool:
    """Returns True when every zone passed its final count check."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if pointer_store is not None and pointer_store == target:
        raise ConfigurationError(
            "--pointer-store equals --to: the target's pointers would be deleted as the "
            "Cassandra zones empty; stop the Cassandra consumers and omit --pointer-store"
        )
    url = parse_cassandra_url(source)
    console = Console(stderr=True)
    dst = Quick.open(target)
    pointers = Quick.open(pointer_store) if pointer_store else None
    cluster, session = connect(url)
    try:
        store = CassandraZoneStore(
            session,
            url.keyspace,
            (pointers or dst).kv,
            (pointers or dst).toplevel,
            table=url.table,
            consistency=url.consistency,
            serial_consistency=url.serial_consistency,
            timeout_s=url.timeout_s,
        )
        zones = [
            z
            for z in store.zones()
            if (app is None or z.app == app) and (tenant is None or z.tenant == tenant)
        ]
        if dry_run:
            total = 0
            for z in zones:
                n = store.count(z)
                total += n
                console.print(f"{z.app}\t{z.tenant}\t{n}")
            console.print(f"dry run: {len(zones)} zones, {total} items would move")
            return True
        bad: list[MoveReport] = []
        lock = threading.Lock()
        with Progress(
            TextColumn("[bold]migrate"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("zones, {task.fields[items]} items"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("zones", total=len(zones), items=0)
            moved = [0]

            def on_moved(n: int) -> None:
                with lock:
                    moved[0] += n
                    progress.update(task, items=moved[0])

            def on_zone(report: MoveReport) -> None:
                progress.advance(task)
                if not report.ok and report.source_before:
                    bad.append(report)

            result = migrate(
                store,
                dst,
                source_name=url.display,
                pointers=pointers,
                app=app,
                tenant=tenant,
                resume=resume,
                include_leased=include_leased,
                lease_wait_s=lease_wait_s,
                workers=workers,
                zones=zones,
                on_zone=on_zone,
                on_moved=on_moved,
            )
        console.print(
            f"run {result.run_id}: {result.zones} zones ({result.skipped_done} already done), "
            f"{result.moved} items moved"
        )
        for report in result.incomplete:
            console.print(
                f"[yellow]{report.zone}: {report.source_after} items left in Cassandra "
                f"({report.skipped_leased} leased); {'; '.join(report.notes)}"
            )
        return not result.incomplete
    finally:
        cluster.shutdown()
        dst.close()
        if pointers is not None:
            pointers.close()


@click.group("cassandra")
def cassandra_group() -> None:
    """Cassandra zones: work items in Cassandra, pointers in a KV store."""


@cassandra_group.command("init")
@click.option("--contact-points", required=True, help="h1,h2[:port]")
@click.option("--keyspace", required=True)
@click.option(
    "--replication",
    default="SimpleStrategy:1",
    show_default=True,
    help="SimpleStrategy:N, NetworkTopologyStrategy:dc1=3,dc2=3, or a CQL map.",
)
@click.option("--table", default="zone_rows", show_default=True)
@click.option("--gc-grace", type=int, default=None, help="gc_grace_seconds of the zone table.")
@friendly
def cassandra_init(
    contact_points: str, keyspace: str, replication: str, table: str, gc_grace: int | None
) -> None:
    """Create the keyspace and the zone table (idempotent)."""
    from quickzones.adapters.cassandra.schema import init_schema

    url = parse_cassandra_url(f"cassandra://{contact_points}/{keyspace}?table={table}")
    cluster, session = connect(url)
    try:
        init_schema(
            session, keyspace, replication=replication, table=table, gc_grace_seconds=gc_grace
        )
    finally:
        cluster.shutdown()
    click.echo(f"keyspace {keyspace} and table {keyspace}.{table} ready")


@cassandra_group.command("repair")
@click.option("--items", "items_url", required=True, help="cassandra://h1,h2:9042/keyspace")
@click.option("--pointer-store", required=True, help="The deployment's pointer KV store URL.")
@click.option("--cluster", default="default", show_default=True, help="Top-level queue name.")
@click.option("--shards", type=int, default=None,
              help="Its shard count; default: the layout stored with it.")
@click.option("--app", default=None, help="Only this app's zones.")
@click.option("--dry-run", is_flag=True, help="List zones without a pointer; change nothing.")
@friendly
def cassandra_repair(
    items_url: str,
    pointer_store: str,
    cluster: str,
    shards: int | None,
    app: str | None,
    dry_run: bool,
) -> None:
    """Give every non-empty Cassandra zone without a pointer one (items orphaned by a
    producer that crashed between its Cassandra write and its pointer transaction)."""
    from quickzones.adapters.cassandra.quick import open_cassandra_quick
    from quickzones.adapters.cassandra.repair import repair_pointers

    q = open_cassandra_quick(items_url, pointer_store, cluster=cluster, shards=shards)
    try:
        zones = (z for z in q.items.zones() if app is None or z.app == app)
        report = repair_pointers(q.items, zones, dry_run=dry_run)
    finally:
        q.close()
    for zone in report.repaired:
        click.echo(f"{zone.app}\t{zone.tenant}")
    verb = "would get" if dry_run else "got"
    click.echo(
        f"{report.zones_checked} zones checked; {len(report.repaired)} {verb} a pointer",
        err=True,
    )


@click.command("migrate")
@click.option("--from", "source", required=True, help="cassandra://h1,h2:9042/keyspace")
@click.option("--to", "target", required=True, help="Target KV store URL.")
@click.option("--pointer-store", default=None, help="The Cassandra deployment's pointers.")
@click.option("--app", default=None)
@click.option("--tenant", default=None)
@click.option("--dry-run", is_flag=True, help="List zones and counts; change nothing.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run.")
@click.option("--include-leased", is_flag=True, help="Take over running items' leases.")
@click.option("--lease-wait", type=float, default=60.0, show_default=True)
@click.option("--workers", type=int, default=8, show_default=True)
@friendly
def migrate_cmd(
    source: str,
    target: str,
    pointer_store: str | None,
    app: str | None,
    tenant: str | None,
    dry_run: bool,
    resume: bool,
    include_leased: bool,
    lease_wait: float,
    workers: int,
) -> None:
    """Move queued items from Cassandra zones into KV zones with pointers."""
    ok = run_migrate(
        source,
        target,
        pointer_store=pointer_store,
        app=app,
        tenant=tenant,
        dry_run=dry_run,
        resume=resume,
        include_leased=include_leased,
        lease_wait_s=lease_wait,
        workers=workers,
    )
    sys.exit(0 if ok else 1)

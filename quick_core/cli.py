"""The ``quick`` command line."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from quick_core.errors import HandlerImportError, QuickError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "sqlite:///quick.db"


def _store_option(fn: F) -> F:
    return click.option(
        "--store",
        envvar="QUICK_STORE",
        default=DEFAULT_STORE,
        show_default=True,
        help="Store URL: sqlite:///path, memory://, fdb://",
    )(fn)


def _friendly(fn: F) -> F:
    """Every quick error becomes one clear line on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except QuickError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """quick: QuiCK queue zones in your own database."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def _open(store: str) -> Any:
    from quick_core.client import Quick

    return Quick.open(store)


@main.command()
@_store_option
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
@_friendly
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
    from quick_core.errors import InvalidArgument

    try:
        body = json.loads(payload)
    except json.JSONDecodeError as err:
        raise InvalidArgument("payload", payload, f"not JSON: {err.msg}") from err
    q = _open(store)
    try:
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
    finally:
        q.close()


def load_handlers(spec: str) -> Any:
    """Import ``module`` or ``module:attr``; the attribute (default ``quick``) must be a
    :class:`Quick` with handlers registered."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure in user code
        raise HandlerImportError(module_name, err) from err
    name = attr or "quick"
    try:
        found = getattr(module, name)
    except AttributeError as err:
        raise HandlerImportError(spec, err) from err
    from quick_core.client import Quick

    inner = getattr(found, "quick", None)  # an AsyncQuick wraps its Quick
    if not isinstance(found, Quick) and isinstance(inner, Quick):
        found = inner
    if not isinstance(found, Quick):
        raise HandlerImportError(spec, TypeError(f"{name} is not a Quick or AsyncQuick"))
    return found


@main.command()
@click.option("--app-module", "app_module", required=True, help="module[:attr] with a Quick.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--managers", type=int, default=4, show_default=True)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics.")
@click.option("--election", default=None, help="redis://... or memcached://... scanner lease.")
@_friendly
def worker(
    app_module: str, workers: int, managers: int, metrics_port: int | None, election: str | None
) -> None:
    """Run a consumer until SIGTERM/SIGINT."""
    from quick_core.consumer import ConsumerConfig
    from quick_core.urls import open_election

    sys.path.insert(0, os.getcwd())
    q = load_handlers(app_module)
    observer = None
    if metrics_port is not None:
        from quick_core.metrics import serve_metrics

        observer = serve_metrics(q, metrics_port)
    el = open_election(election) if election else None
    consumer = q.consumer(
        ConsumerConfig(workers=workers, managers=managers), election=el, observer=observer
    )
    click.echo(f"quick worker {consumer.name}: job types {', '.join(q.registry.names())}")
    consumer.run_forever()


@main.command()
@_store_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_friendly
def stats(store: str, as_json: bool) -> None:
    """Counts per app, tenant and job type; active zones; dead letters."""
    from rich.console import Console
    from rich.table import Table

    from quick_core.admin import stats as compute

    q = _open(store)
    try:
        s = compute(q)
    finally:
        q.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "by_app": dict(s.items_by_app),
                    "by_tenant": {f"{a}/{t}": n for (a, t), n in s.items_by_zone.items()},
                    "by_job_type": dict(s.items_by_job_type),
                    "vested": s.vested,
                    "leased": s.leased,
                    "corrupt": s.corrupt,
                    "active_zones": s.active_zones,
                    "dead_letters": s.dead_letters,
                },
                sort_keys=True,
            )
        )
        return
    console = Console()
    table = Table(title="items")
    for col in ("app", "tenant", "items"):
        table.add_column(col)
    for (app, tenant), n in sorted(s.items_by_zone.items()):
        table.add_row(app, tenant, str(n))
    console.print(table)
    by_type = ", ".join(f"{k}={v}" for k, v in sorted(s.items_by_job_type.items())) or "none"
    console.print(f"by job type: {by_type}")
    console.print(
        f"vested {s.vested}, leased {s.leased}, corrupt {s.corrupt}, "
        f"active zones {s.active_zones}, dead letters {s.dead_letters}"
    )


@main.command()
@_store_option
@_friendly
def zones(store: str) -> None:
    """Zones that have a pointer (active zones)."""
    from quick_core.admin import active_zones

    q = _open(store)
    try:
        for z in active_zones(q):
            state = "leased" if z.leased else "idle"
            click.echo(f"{z.zone.app}\t{z.zone.tenant}\t{z.count}\t{state}")
    finally:
        q.close()


@main.group("dead-letters")
def dead_letters() -> None:
    """List, requeue or purge dead letters."""


@dead_letters.command("list")
@_store_option
@click.option("--app", default=None)
@click.option("--tenant", default=None)
@_friendly
def dead_letters_list(store: str, app: str | None, tenant: str | None) -> None:
    from quick_core.admin import list_dead_letters

    q = _open(store)
    try:
        for d in list_dead_letters(q, app, tenant):
            job = d.item.job_type if d.item is not None else "?"
            click.echo(f"{d.zone.app}\t{d.zone.tenant}\t{d.item_id}\t{job}\t{d.reason}")
    finally:
        q.close()


@dead_letters.command("requeue")
@_store_option
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--id", "item_id", default=None, help="One item; default every dead letter.")
@_friendly
def dead_letters_requeue(store: str, app: str, tenant: str, item_id: str | None) -> None:
    from quick_core.admin import list_dead_letters, requeue_dead_letter

    q = _open(store)
    try:
        ids = (
            [item_id]
            if item_id
            else [d.item_id for d in list_dead_letters(q, app, tenant) if d.item is not None]
        )
        for i in ids:
            requeue_dead_letter(q, q.zone(app, tenant), i)
        click.echo(f"requeued {len(ids)}")
    finally:
        q.close()


@dead_letters.command("purge")
@_store_option
@click.option("--app", default=None)
@click.option("--tenant", default=None)
@_friendly
def dead_letters_purge(store: str, app: str | None, tenant: str | None) -> None:
    from quick_core.admin import purge_dead_letters

    q = _open(store)
    try:
        click.echo(f"purged {purge_dead_letters(q, app, tenant)}")
    finally:
        q.close()


@main.command()
@click.option("--store", default=None, help="Store URL (default: a fresh SQLite file).")
@click.option("--tenants", type=int, default=20, show_default=True, help="Small tenants.")
@click.option("--noisy-factor", type=int, default=100, show_default=True)
@click.option(
    "--rate", type=float, default=5.0, show_default=True, help="Items/s per small tenant."
)
@click.option("--duration", type=float, default=20.0, show_default=True, help="Seconds of load.")
@click.option("--work-ms", type=float, default=2.0, show_default=True, help="Work per item.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@_friendly
def demo(
    store: str | None,
    tenants: int,
    noisy_factor: int,
    rate: float,
    duration: float,
    work_ms: float,
    workers: int,
    seed: int,
) -> None:
    """Many tenants, one noisy one: watch the small ones stay fast."""
    from quick_core.demo import DemoConfig, run_demo

    ok = run_demo(
        DemoConfig(
            store=store,
            tenants=tenants,
            noisy_factor=noisy_factor,
            rate=rate,
            duration_s=duration,
            work_ms=work_ms,
            workers=workers,
            seed=seed,
        )
    )
    sys.exit(0 if ok else 1)


# --- Cassandra zones, migration, tenant moves ---------------------------------------------


@main.group("cassandra")
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
@_friendly
def cassandra_init(
    contact_points: str, keyspace: str, replication: str, table: str, gc_grace: int | None
) -> None:
    """Create the keyspace and the zone table (idempotent)."""
    from adapters.cassandra.driver import connect
    from adapters.cassandra.schema import init_schema
    from adapters.cassandra.url import parse_cassandra_url

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
@click.option("--shards", type=int, default=1, show_default=True, help="Its shard count.")
@click.option("--app", default=None, help="Only this app's zones.")
@click.option("--dry-run", is_flag=True, help="List zones without a pointer; change nothing.")
@_friendly
def cassandra_repair(
    items_url: str,
    pointer_store: str,
    cluster: str,
    shards: int,
    app: str | None,
    dry_run: bool,
) -> None:
    """Give every non-empty Cassandra zone without a pointer one (items orphaned by a
    producer that crashed between its Cassandra write and its pointer transaction)."""
    from adapters.cassandra.quick import open_cassandra_quick
    from adapters.cassandra.repair import repair_pointers

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


@main.command("migrate")
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
@_friendly
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
    from adapters.cassandra.cli import run_migrate

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


@main.command("move-tenant")
@click.option("--from", "source", required=True, help="Source KV store URL.")
@click.option("--to", "target", required=True, help="Target KV store URL.")
@click.option("--app", required=True)
@click.option("--tenant", required=True)
@click.option("--include-leased", is_flag=True, help="Take over running items' leases.")
@click.option("--lease-wait", type=float, default=60.0, show_default=True)
@_friendly
def move_tenant_cmd(
    source: str, target: str, app: str, tenant: str, include_leased: bool, lease_wait: float
) -> None:
    """Move one tenant's zone between KV stores: zone, then pointer, then remove source."""
    from quick_core.errors import ConfigurationError
    from quick_core.tenant_move import move_tenant

    if source == target:
        raise ConfigurationError("--from and --to name the same store")
    src, dst = _open(source), _open(target)
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


if __name__ == "__main__":
    main()

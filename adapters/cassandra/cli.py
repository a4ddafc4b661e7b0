"""The body of ``quick migrate``: open both sides, show a progress bar, report counts."""

from __future__ import annotations

import threading

from adapters.cassandra.driver import connect
from adapters.cassandra.migrate import migrate
from adapters.cassandra.store import CassandraZoneStore
from adapters.cassandra.url import parse_cassandra_url
from quick_core.client import Quick
from quick_core.errors import ConfigurationError
from quick_core.tenant_move import MoveReport


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

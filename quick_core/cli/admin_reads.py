"""``quick stats`` and ``quick zones``: what the store holds, read without changing it."""

from __future__ import annotations

import json
from typing import Any

import click

from quickzones.cli.fairness import limit_json, weight_json
from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option
from quickzones.cli.output import make_console, make_table, when


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document (an object).")
@friendly
def stats(store: str, as_json: bool) -> None:
    """Counts per app, tenant and job type; active zones; dead letters."""
    from rich.console import Console
    from rich.table import Table

    from quickzones.store.admin import stats as compute

    with open_store(store, create=False) as q:
        s = compute(q)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "by_app": dict(s.items_by_app),
                    # by_tenant's "app/tenant" keys are ambiguous once a name holds a
                    # "/": by_zone says which is which.
                    "by_zone": [
                        {"app": a, "tenant": t, "items": n}
                        for (a, t), n in sorted(s.items_by_zone.items())
                    ],
                    "by_tenant": {f"{a}/{t}": n for (a, t), n in s.items_by_zone.items()},
                    "by_job_type": dict(s.items_by_job_type),
                    "vested": s.vested,
                    "leased": s.leased,
                    "corrupt": s.corrupt,
                    "active_zones": s.active_zones,
                    "dead_letters": s.dead_letters,
                    "pointers_set_aside": s.corrupt_pointers,
                    "in_order_scanner": _scanner_json(s),
                    "paused": [p.as_dict() for p in s.paused],
                    "weights": [weight_json(w) for w in s.weights],
                    "tenant_limits": [limit_json(lim) for lim in s.tenant_limits],
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
    # Undecodable pointer records kept for an operator (store/pointer_repair.py); their
    # zones were rebuilt and still run.
    console.print(f"pointers set aside {s.corrupt_pointers}", highlight=False)
    console.print(_scanner_line(s), highlight=False)
    held = "; ".join(p.describe() for p in s.paused) or "nothing"
    console.print(f"paused: {held}", highlight=False)
    weights = "; ".join(w.describe() for w in s.weights) or "none (every tenant weighs 1)"
    console.print(f"weights: {weights}", highlight=False)
    limits = "; ".join(lim.describe() for lim in s.tenant_limits) or "none"
    console.print(f"tenant limits: {limits}", highlight=False)


def _scanner_json(s: Any) -> dict[str, Any]:
    """Who holds the top-level queue's in-order scanner lease (``quick stats --json``)."""
    lease = s.in_order_scanner
    if lease is None:
        return {"held": False, "holder": None, "term": None, "expires": None}
    return {
        "held": lease.held_at(s.read_at_ms),
        "holder": lease.holder,
        "term": lease.term,
        "expires": when(lease.expires_ms) if lease.expires_ms else None,
    }


def _scanner_line(s: Any) -> str:
    lease = s.in_order_scanner
    if lease is None:
        return "in-order scanner: none elected yet"
    if lease.held_at(s.read_at_ms):
        left = (lease.expires_ms - s.read_at_ms) / 1000
        return f"in-order scanner: {lease.holder} (term {lease.term}, lease ends in {left:.1f}s)"
    ended = when(lease.expires_ms) if lease.expires_ms else "released"
    return f"in-order scanner: none (last {lease.holder}, term {lease.term}, ended {ended})"


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document (a list of zones).")
@friendly
def zones(store: str, as_json: bool) -> None:
    """Zones that have a pointer (active zones): items, lease state, next visit."""
    from quickzones.store.admin import active_zones

    with open_store(store, create=False) as q:
        found = active_zones(q)
    docs = [
        {
            "app": z.zone.app,
            "tenant": z.zone.tenant,
            "items": z.count,
            "leased": z.leased,
            "pointer_vesting_ms": z.pointer_vesting_ms,
            "pointer_vesting": when(z.pointer_vesting_ms),
        }
        for z in found
    ]
    if as_json:
        click.echo(json.dumps(docs, ensure_ascii=False))
        return
    rows = [
        [
            str(d["app"]),
            str(d["tenant"]),
            str(d["items"]),
            "leased" if d["leased"] else "idle",
            str(d["pointer_vesting"] or ""),
        ]
        for d in docs
    ]
    make_console().print(
        make_table("active zones", ["app", "tenant", "items", "state", "next visit (UTC)"], rows)
    )

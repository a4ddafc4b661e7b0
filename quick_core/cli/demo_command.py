"""``quick demo``: the command that runs :mod:`quickzones.cli.demo`."""

from __future__ import annotations

import sys

import click

from quickzones.cli.group import main
from quickzones.cli.options import cpus_option, friendly


@main.command()
@click.option(
    "--store",
    default=None,
    help="Store URL (default: the group's --store, else a fresh SQLite file; never "
    "$QUICK_STORE, so the demo does not load a real store by accident).",
)
@click.option("--tenants", type=int, default=20, show_default=True, help="Small tenants.")
@click.option("--noisy-factor", type=int, default=100, show_default=True)
@click.option(
    "--rate", type=float, default=5.0, show_default=True, help="Items/s per small tenant."
)
@click.option("--duration", type=float, default=None, help="Seconds of load.  [default: 20.0]")
@click.option("--seconds", type=float, default=None, help="The same as --duration.")
@click.option("--work-ms", type=float, default=2.0, show_default=True, help="Work per item.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--pickups",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write every item's pickup (ms) to this file as JSON: small and noisy tenants'.",
)
@cpus_option
@friendly
def demo(
    store: str | None,
    tenants: int,
    noisy_factor: int,
    rate: float,
    duration: float | None,
    seconds: float | None,
    work_ms: float,
    workers: int,
    seed: int,
    pickups: str | None,
    cpus: str | set[int],
) -> None:
    """Many tenants, one noisy one: watch the small ones stay fast."""
    from quickzones.cli.demo import DemoConfig, run_demo

    if duration is not None and seconds is not None:
        raise click.UsageError("give --seconds or --duration (the same option), not both")
    if store is None:
        store = (click.get_current_context().find_root().obj or {}).get("typed_store")

    from quickzones.cpu_placement import CpuPlacement

    # One process, GIL-bound: its producers' and consumer's threads on one CPU (auto).
    placement = CpuPlacement(cpus)
    placement.start()
    try:
        ok = run_demo(
            DemoConfig(
                store=store,
                tenants=tenants,
                noisy_factor=noisy_factor,
                rate=rate,
                duration_s=next((d for d in (duration, seconds) if d is not None), 20.0),
                work_ms=work_ms,
                workers=workers,
                seed=seed,
                pickups=pickups,
            )
        )
    finally:
        placement.stop()  # run inside another process (a test's CliRunner): as found
    sys.exit(0 if ok else 1)

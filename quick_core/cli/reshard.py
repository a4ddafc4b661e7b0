"""``quick reshard --shards N``: change how many shards a top-level queue has, while its
producers and consumers run (:mod:`quickzones.store.reshard`; docs/operations.md)."""

from __future__ import annotations

import click

from quickzones.cli.group import main
from quickzones.cli.options import friendly, open_store, store_option


@main.command("reshard")
@store_option
@click.option("--shards", type=int, required=True, help="The shard count to move to.")
@click.option("--cluster", default="default", show_default=True, help="Which top-level queue.")
@friendly
def reshard(store: str, shards: int, cluster: str) -> None:
    """Spread the top-level queue's pointers over SHARDS shards, online. Safe to stop
    and run again: a reshard under way is resumed."""
    from quickzones.store.reshard import reshard as run_reshard

    with open_store(store, create=False, cluster=cluster) as q:
        before = q.toplevel.layout.describe()

        def progress(number: int, moved: int) -> None:
            click.echo(f"pass {number}: moved {moved} pointers", err=True)

        report = run_reshard(q.toplevel, shards, on_pass=progress)
    if report.passes == 0:
        click.echo(f"cluster {cluster!r} already has {before}: nothing to do")
        return
    click.echo(
        f"cluster {cluster!r}: {_shards(report.old_shards)} -> {_shards(report.shards)}, "
        f"{report.moved} pointers moved in {report.passes} passes"
    )


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"

"""``python manage.py quick_worker [quick worker's options]``: ``quick worker`` running this
project's tasks (``--app-module quickzones.adapters.django.worker_app``, which the command
names itself). Its options are quick worker's own click options, taken from that command
rather than copied, so ``--workers``, ``--processes``, ``--apps``, ``--types`` and the
rest mean what they mean there; ``QUICK_DJANGO_BACKEND`` names the ``TASKS`` alias
(default ``default``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandParser

from quickzones.cli.worker import worker

WORKER_APP = "quickzones.adapters.django.worker_app"
# Django's own options, applied by manage.py before any command runs (and by the
# environment they set: a --processes child inherits DJANGO_SETTINGS_MODULE).
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def worker_command() -> click.Command:
    """quick worker's command with ``--app-module`` fixed to :data:`WORKER_APP`."""

    def run(**options: Any) -> None:
        click.get_current_context().invoke(worker.callback, app_module=WORKER_APP, **options)  # type: ignore[arg-type]

    return click.Command(
        "quick_worker",
        params=[p for p in worker.params if p.name != "app_module"],
        callback=run,
        help=f"Run quick worker on this project's tasks (--app-module {WORKER_APP}), "
        "until SIGTERM/SIGINT. QUICK_DJANGO_BACKEND names the TASKS alias (default "
        "'default').",
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def _without_django_options(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _DJANGO_OPTIONS)):
            kept.append(arg)
    return kept


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run quick worker on this project's tasks; every quick worker option passes through."

    def run_from_argv(self, argv: list[str]) -> None:
        # quick worker parses its own options (click), not Django's argparse.
        prog = f"{Path(argv[0]).name} {argv[1]}"
        # A --processes child runs `python -m quickzones worker`: it finds the project
        # where manage.py is, from any working directory.
        here = str(Path(argv[0]).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (here, os.environ.get("PYTHONPATH", "")) if p
        )
        worker_command().main(_without_django_options(argv[2:]), prog_name=prog)

    def print_help(self, prog_name: str, subcommand: str) -> None:  # manage.py help
        with click.Context(
            worker_command(), info_name=f"{Path(prog_name).name} {subcommand}"
        ) as ctx:
            click.echo(ctx.get_help())

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker_args", nargs="*", help="quick worker's options, after --")

    def handle(self, *args: Any, **options: Any) -> None:  # call_command("quick_worker", ...)
        worker_command().main(list(options["worker_args"]), prog_name="quick_worker")

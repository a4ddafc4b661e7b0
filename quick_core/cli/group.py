"""The ``quick`` group: its own options, the registered commands it loads, and the refusal
of a ``--store`` that the command run would not use."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click
from click.core import ParameterSource

from quickzones.cli.options import STORE_HELP
from quickzones.cli.plugins import COMMANDS_GROUP, Unavailable, load_command


class _QuickGroup(click.Group):
    """The ``quick`` group: the core's commands, then those implementations register in
    the ``quickzones.cli`` entry point group (the Cassandra adapter's ``cassandra`` and
    ``migrate``, or a third party's). The core imports none of them: a registered command
    is loaded only when ``quick --help`` lists it or it runs. A built-in name wins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._registered: dict[str, list[EntryPoint]] | None = None
        self._loaded: dict[str, click.Command] = {}

    def _entry_points(self) -> dict[str, list[EntryPoint]]:
        if self._registered is None:
            table: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=COMMANDS_GROUP):
                same = table.setdefault(ep.name, [])
                if all(other.value != ep.value for other in same):
                    same.append(ep)
            self._registered = table
        return self._registered

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta[_SUBCOMMAND_ARGS] = rest  # for _refuse_unused_store, before the callback
        return name, command, rest

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        if cmd_name not in self._loaded:
            candidates = self._entry_points().get(cmd_name)
            if not candidates:
                return None
            self._loaded[cmd_name] = load_command(cmd_name, candidates)
        return self._loaded[cmd_name]


_SUBCOMMAND_ARGS = "quickzones.subcommand_args"

# Where the built-in commands without a --store take their stores from.
_STORE_ELSEWHERE = {
    "worker": "it runs the Quick that --app-module builds, on the store that Quick opened",
    "periodic": "it reads the schedules of the Quick that --app-module builds",
    "move-tenant": "it moves between the stores named by --from and --to",
}


def _uses_store(command: click.Command) -> bool:
    """True when ``command`` (every command of a group) has a ``--store`` option, which
    falls back to the group's (see :func:`quickzones.cli.options.store_option`)."""
    if isinstance(command, click.Group):
        return all(_uses_store(sub) for sub in command.commands.values())
    return any(isinstance(p, click.Option) and "--store" in p.opts for p in command.params)


def _refuse_unused_store(ctx: click.Context, store: str) -> None:
    """``quick --store X cmd``: a usage error when ``cmd`` would not use X, so a store
    given on the command line is never silently ignored. ``$QUICK_STORE`` is ambient
    and not checked; ``--help`` still works."""
    name = ctx.invoked_subcommand
    group = ctx.command
    if name is None or not isinstance(group, click.Group):
        return
    command = group.get_command(ctx, name)
    rest: list[str] = ctx.meta.get(_SUBCOMMAND_ARGS, [])
    if command is None or any(h in rest for h in ctx.help_option_names):
        return
    path = [name]
    # Down a command group to the command that runs (``dead-letters list``).
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return  # click reports the unknown command
        path.append(rest[0])
        command, rest = sub, rest[1:]
    if _uses_store(command) or isinstance(command, Unavailable):
        return  # an unavailable command says why it cannot run (the extra to install)
    shown = " ".join(path)
    hint = _STORE_ELSEWHERE.get(path[0], f"see quick {shown} --help for the options it takes")
    raise click.UsageError(
        f"quick {shown} does not use --store {store}: {hint}. Drop --store.", ctx=ctx
    )


@click.group(cls=_QuickGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="quickzones", prog_name="quick")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--store", envvar="QUICK_STORE", default=None, help=STORE_HELP)
@click.pass_context
def main(ctx: click.Context, verbose: int, store: str | None) -> None:
    """quick: QuiCK queue zones in your own database."""
    typed = store is not None and ctx.get_parameter_source("store") is ParameterSource.COMMANDLINE
    ctx.obj = {"store": store, "typed_store": store if typed else None}
    if typed and store is not None:
        _refuse_unused_store(ctx, store)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")

"""The commands implementations add to ``quick`` through the ``quickzones.cli`` entry point
group, and what stands in for one that cannot be loaded."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from typing import Any

import click

from quickzones.cli.options import error_line
from quickzones.errors import ConfigurationError, MissingDependency

# Entry point group of command groups that implementations add to ``quick``: the name is
# the command's, the value a click command or group (``module:attr``).
COMMANDS_GROUP = "quickzones.cli"


class Unavailable(click.Command):
    """A registered command that could not be loaded (its extra not installed, most
    often): it takes any option, ``--store`` included, and running it says why."""


def _unavailable(name: str, reason: str) -> click.Command:
    """Stands in for a registered command that cannot be loaded, so ``quick --help`` and
    every other command still work and running it says why, in one line."""

    def refuse(**_: Any) -> None:
        error_line(ConfigurationError(f"command {name!r} {reason}"))
        sys.exit(2)

    return Unavailable(
        name,
        callback=refuse,
        help=f"(unavailable) {reason}",
        short_help="(unavailable)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


def load_command(name: str, candidates: list[EntryPoint]) -> click.Command:
    if len(candidates) > 1:
        values = ", ".join(ep.value for ep in candidates)
        return _unavailable(name, f"is registered by more than one entry point ({values})")
    ep = candidates[0]
    try:
        command = ep.load()
    except MissingDependency as err:  # its extra is not installed: the message names it
        return _unavailable(name, f"cannot run: {err}")
    except Exception as err:  # a broken or half-installed implementation
        return _unavailable(
            name, f"(entry point {ep.value}) failed to load: {type(err).__name__}: {err}"
        )
    if not isinstance(command, click.Command):
        return _unavailable(name, f"(entry point {ep.value}) is not a click command")
    return command

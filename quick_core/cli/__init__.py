"""The ``quick`` command line.

The group and its options are in :mod:`quickzones.cli.group`, the commands implementations
register in :mod:`quickzones.cli.plugins`, what the built-in commands share in
:mod:`quickzones.cli.options`, and each built-in command in a module of its own.
"""

from __future__ import annotations

from quickzones.cli.app_module import load_handlers
from quickzones.cli.group import main
from quickzones.cli.options import DEFAULT_STORE, friendly, store_option
from quickzones.cli.plugins import COMMANDS_GROUP

# isort: split
# The built-in commands, registered here and nowhere else: importing a module adds its
# commands to ``main`` (each is ``@main.command()``). A new one is one more line here.
from quickzones.cli import admin_reads as admin_reads  # stats, zones
from quickzones.cli import batch as batch  # batch show
from quickzones.cli import dead_letters as dead_letters  # dead-letters list|requeue|purge
from quickzones.cli import demo_command as demo_command  # demo
from quickzones.cli import enqueue as enqueue  # enqueue
from quickzones.cli import explain as explain  # explain
from quickzones.cli import fairness as fairness  # weight and limit set|show|clear
from quickzones.cli import limits as limits  # limits set|list|delete (named limits)
from quickzones.cli import move_tenant as move_tenant  # move-tenant
from quickzones.cli import pause as pause  # pause, resume, paused
from quickzones.cli import periodic as periodic  # periodic list
from quickzones.cli import reshard as reshard  # reshard
from quickzones.cli import worker as worker  # worker

__all__ = ["COMMANDS_GROUP", "DEFAULT_STORE", "friendly", "load_handlers", "main", "store_option"]

if __name__ == "__main__":
    main()

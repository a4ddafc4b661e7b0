"""How the admin commands show times and tables."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo


def when(ms: int | None) -> str | None:
    """A store time (ms since the epoch) as ISO 8601 UTC, to the millisecond."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def when_in(ms: int, tz: str) -> str:
    """A store time as ISO 8601 in time zone ``tz``, with its offset, to the second."""
    moment = datetime.fromtimestamp(ms / 1000, tz=ZoneInfo(tz))
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def make_console() -> Any:
    from rich.console import Console

    # Piped output has no terminal width: do not fold ids and times into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 250)


def make_table(title: str, columns: list[str], rows: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table

"""``docs/configuration.md`` tells a user when to change each setting (issue 27 point 5):
every ``ConsumerConfig`` field's row and every ``quick worker`` option's row says when you
would change it, not only what it is."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click

from quickzones.cli import main
from quickzones.consumer import ConsumerConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
# Its row is rewritten with the dispatch rules (issue 27, another point).
NOT_HERE = {"processing_bound"}


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _row(section: str, name: str) -> str | None:
    match = re.search(rf"^\| `{re.escape(name)}` \|.*$", section, flags=re.MULTILINE)
    return match[0] if match else None


def test_every_consumer_config_field_says_when_to_change_it() -> None:
    section = _section("`ConsumerConfig(...)`")
    silent = []
    for field in dataclasses.fields(ConsumerConfig):
        if field.name in NOT_HERE:
            continue
        row = _row(section, field.name)
        if row is None or "Change it" not in row:
            silent.append(field.name)
    assert silent == [], f"rows that do not say when to change them: {silent}"


def test_every_worker_option_is_in_its_table_with_when_to_change_it() -> None:
    command = main.commands["worker"]
    flags = [
        max(p.opts, key=len)
        for p in command.params
        if isinstance(p, click.Option) and p.name != "help" and not p.hidden
    ]
    assert len(flags) >= 10, flags
    section = _section("`quick worker` options")
    missing = []
    for flag in flags:
        row = _row(section, flag)
        # The last cell says when to change it.
        if row is None or len(row.rstrip(" |").rsplit("|", 1)[-1].split()) < 4:
            missing.append(flag)
    assert missing == [], f"worker options not described: {missing}"

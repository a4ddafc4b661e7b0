"""``quick worker --help`` fits one screen (issue 27 point 5): the options a user sets to run
a worker, not the knobs one benchmark workload was tuned with. Those stay ConsumerConfig
fields for Python users; as options they are gone, and giving one is click's clear error,
with nothing started."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from quickzones.cli import main

KEPT = (
    "--app-module",
    "--workers",
    "--managers",
    "--lease",
    "--shutdown-deadline",
    "--dequeue-max",
    "--processes",
    "--metrics-port",
    "--metrics-address",
    "--election",
    "--remote",
    "--token",
    "--apps",
    "--types",
    "--unhandled-grace",
)
# Each tuned one benchmark workload; each is a ConsumerConfig field (docs/configuration.md).
REMOVED = (
    ("--one-transaction-visits", []),
    ("--three-transaction-visits", []),
    ("--visits-per-transaction", ["8"]),
    ("--commit-poll", ["0.001"]),
    ("--completion-flush", ["0.01"]),
    ("--timer-lookahead", ["0"]),
    ("--visit-max", ["200"]),
    # A supervised child's switch: the supervisor sets QUICK_METRICS_SHARED in the
    # children's environment instead (issue 27 point 5, review).
    ("--metrics-shared", []),
)


def _help() -> str:
    result = CliRunner().invoke(main, ["worker", "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_worker_help_fits_one_screen() -> None:
    lines = _help().splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines:\n" + "\n".join(lines)
    assert max(len(line) for line in lines) <= 80


def test_worker_help_lists_what_a_user_sets() -> None:
    text = _help()
    assert [flag for flag in KEPT if flag not in text] == []
    assert [flag for flag, _ in REMOVED if flag in text] == []


@pytest.mark.parametrize(("flag", "value"), REMOVED)
def test_a_removed_worker_option_is_clicks_clear_error(flag: str, value: list[str]) -> None:
    result = CliRunner().invoke(main, ["worker", "--app-module", "nowhere", flag, *value])
    assert result.exit_code == 2, result.output
    assert f"No such option: {flag}" in result.output or f"No such option '{flag}'" in (
        result.output
    ), result.output
    assert "Traceback" not in result.output


def test_worker_has_no_hidden_options() -> None:
    """Every option of ``quick worker`` is one a user may type: what only the supervisor
    tells its children travels in their environment, not on their command lines."""
    command = main.commands["worker"]
    hidden = [p.opts[0] for p in command.params if isinstance(p, click.Option) and p.hidden]
    assert hidden == []

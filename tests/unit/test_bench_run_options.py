"""The fairness runs (``bench.weights``, ``bench.tenant_rate``) take the same run options,
``--seconds``, ``--store`` and ``--out``, with the same defaults, beside their own; their
``--help`` works as a user types it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.common import REPO, store_run_parser, store_url


@pytest.mark.parametrize(
    ("module", "own"),
    [("bench.weights", ["--workers", "--work-ms", "--keep"]),
     ("bench.tenant_rate", ["--rate", "--processes"])],
)  # fmt: skip
def test_each_run_takes_the_shared_options_and_its_own(module: str, own: list[str]) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    for flag in ["--seconds", "--store", "--out", *own]:
        assert f"{flag} " in shown.stdout, (module, flag)
    assert "a store URL (default: a new SQLite file)" in shown.stdout


def test_the_shared_options_default_to_a_minute_over_a_new_sqlite_file() -> None:
    args = store_run_parser("One run.\nMore.").parse_args([])
    assert (args.seconds, args.store, args.out) == (60.0, None, None)
    assert store_url("memory://", "x.db") == "memory://"
    made = store_url(None, "x.db")
    assert made.startswith("sqlite:///") and made.endswith("/x.db")

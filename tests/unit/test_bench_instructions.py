"""The instruction-count bench itself: what a child does, how an op's count is taken from
two children, that trees alternate, and that callgrind's own output is read."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from bench import instructions
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url


def test_a_drain_child_runs_every_item_it_enqueued() -> None:
    assert instructions.child("drain", 12, True) == 12
    assert instructions.child("enqueue", 3, False) == 0


def test_the_count_callgrind_prints_is_read() -> None:
    stderr = "==41== Events    : Ir\n==41== Collected : 1405918211\n==41==\n==41== I   refs: 1"
    assert instructions.parse_collected(stderr) == 1405918211
    with pytest.raises(RuntimeError, match="no instruction count"):
        instructions.parse_collected("valgrind: command not found")


def test_an_op_costs_the_difference_of_two_children_over_n() -> None:
    seen: list[tuple[str, int, bool]] = []

    def count(python: str, op: str, n: int, drain: bool, dsn: str) -> int:
        seen.append((op, n, drain))
        assert dsn == "sqlite"
        return 1_000_000 + n * (700 if op == "enqueue" else 500) + (n * 1_100 if drain else 0)

    assert instructions.per_op(count, "py", "enqueue", 10) == 700
    assert instructions.per_op(count, "py", "drain", 10) == 1_100
    # The enqueue's base does none; the drain's base enqueues the same items undrained.
    assert seen == [
        ("enqueue", 0, False),
        ("enqueue", 10, False),
        ("drain", 10, False),
        ("drain", 10, True),
    ]
    with pytest.raises(ValueError, match="unknown op"):
        instructions.per_op(count, "py", "scan", 10)


def test_trees_alternate_which_goes_first(tmp_path: Path) -> None:
    pythons: list[str] = []

    def count(python: str, op: str, n: int, drain: bool, dsn: str) -> int:
        pythons.append(python)
        return n * (900 if python == "base" else 800)

    trees = {"this": "this", "baseline": "base"}
    runs = instructions.measure(trees, ["enqueue"], 4, 2, count)

    assert runs == {"this": {"enqueue": [800.0, 800.0]}, "baseline": {"enqueue": [900.0, 900.0]}}
    assert pythons == ["this", "this", "base", "base", "base", "base", "this", "this"]


def test_the_run_writes_each_tree_s_medians(tmp_path: Path) -> None:
    def count(python: str, op: str, n: int, drain: bool, dsn: str) -> int:
        per = 1_100 if drain else (700 if op == "enqueue" else 0)
        return 5_000_000 + n * per + (100 if python == "base" else 0) * n

    out = tmp_path / "run"
    argv = ["--n", "4", "--runs", "3", "--baseline", "base", "--out", str(out)]
    assert instructions.main(argv, count=count) == 0
    written = json.loads((out / "instructions.json").read_text())
    assert written["median_instructions"] == {
        "this": {"enqueue": 700.0, "drain": 1_100.0},
        "baseline": {"enqueue": 800.0, "drain": 1_100.0},
    }
    assert len(written["runs"]["this"]["drain"]) == 3


def test_bad_options_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        instructions.main(["--ops", "enqueue,scan"], count=lambda *a: 0)
    assert "unknown --ops scan" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_child_is_counted_under_callgrind() -> None:
    # The smallest real count: the interpreter's start-up and the store's set-up.
    assert instructions.callgrind_count(sys.executable, "drain", 1, True) > 10_000_000


@pytest.mark.skipif(postgres_skip_reason() is not None, reason=str(postgres_skip_reason()))
def test_a_postgres_child_drains_in_a_schema_of_its_own_and_drops_it() -> None:
    import psycopg

    server = postgres_store_url().split("?")[0]
    assert instructions.child("drain", 6, True, server) == 6
    with psycopg.connect(server, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'instructions_%'"
        ).fetchone()
    assert left == (0,)

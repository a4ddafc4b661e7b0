"""The probe behind the native SQL design (``docs/backends.md``), with tiny settings so it
cannot rot: every variant enqueues on both stores, the native statement stores an item and
its zone's pointer as the design says, and the run's document holds the medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickzones.testing.provision.postgres import postgres_skip_reason

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def test_the_probe_runs_every_variant_and_writes_its_medians(tmp_path: Path) -> None:
    from bench import native_probe

    rc = native_probe.main(
        ["--seconds", "0.3", "--runs", "1", "--threads", "2", "--no-procrastinate",
         "--drain-items", "40", "--out", str(tmp_path)]
    )  # fmt: skip

    assert rc == 0
    doc = json.loads((tmp_path / "native_probe.json").read_text())
    assert doc["command"].startswith("python -m bench.native_probe ")
    postgres, sqlite = doc["postgres"]["medians"], doc["sqlite"]["medians"]
    for kind in ("quick", "native", "plain"):
        assert postgres[f"one producer {kind} calls_s"] > 0
        assert postgres[f"application transactions {kind} tx_s"] > 0
    assert "one producer procrastinate calls_s" not in postgres
    # Every item ran once, its handler succeeding: a drain of failing handlers (retried,
    # dead-lettered) would measure the failures' cost, not the drain's.
    assert postgres["drain quick items"] == postgres["drain quick ran_ok"] == 40
    assert postgres["drain native items"] == 40
    for kind in ("quick", "native", "huey"):
        assert sqlite[f"one producer {kind} calls_s"] > 0
        assert sqlite[f"one producer {kind} cpu_ms"] > 0
    # Both drains ran every item; the native one says how long it held the write lock.
    assert sqlite["drain quick items"] == sqlite["drain quick ran_ok"] == 40
    assert sqlite["drain native items"] == 40
    assert 0 < sqlite["drain native lock_held_p50_ms"] <= sqlite["drain native lock_held_p99_ms"]


def test_the_native_statement_makes_the_pointer_once_and_shares_it(tmp_path: Path) -> None:
    """Two enqueues into one zone: one item row each, one pointer row, made by the first
    (the second finds it and gets its vesting time back for part two)."""
    import psycopg

    from bench import native_probe
    from bench.quickrun import open_quick
    from bench.servers import postgres_server

    with postgres_server() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(native_probe.NATIVE_TABLES)
        q = open_quick(f"{dsn}?schema=probe_quick")
        try:
            first = conn.execute(
                native_probe.NATIVE_ENQUEUE, native_probe.native_args(q, "t1")
            ).fetchone()
            second_args = native_probe.native_args(q, "t1")
            second = conn.execute(native_probe.NATIVE_ENQUEUE, second_args).fetchone()
        finally:
            q.close()
        items = conn.execute("SELECT count(*) FROM probe_native.items").fetchone()
        pointers = conn.execute("SELECT zone, vesting_ms FROM probe_native.pointers").fetchall()
    assert first == (None, None, True)
    assert second is not None and second[2] is False and second[0] <= second_args["vesting"]
    assert items == (2,)
    assert [zone for zone, _ in pointers] == ["a/t1"]

"""``bench.pg_long_txn`` itself, with tiny settings, so it cannot rot: a real ``quick
worker`` process and producer on the tests' PostgreSQL, a snapshot held for two seconds
beside them (``--tuned``: the per-table settings applied first), the samples, the
EXPLAIN probes and the recovery summary it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.pg_long_txn import TABLES, Options, commit_chain, run
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def test_the_long_transaction_bench_runs_with_tiny_settings(tmp_path: Path) -> None:
    schema = postgres_store_url().split("schema=", 1)[1]  # dropped when the session ends
    opts = Options(
        rate=20, small_tenants=5, warmup=1.5, hold=2.0, cooldown=1.5, every=1.0, tuned=True
    )

    result = run(shared_postgres_url(), schema, opts, tmp_path)

    at, commit = result["held_s"]
    assert at is not None and commit is not None and commit - at >= opts.hold - 0.1
    phases = {s["phase"] for s in result["samples"]}
    assert phases == {"warm-up", "hold", "cool-down"}
    assert result["samples"][-1]["started"] > 0
    for sample in result["samples"]:
        assert set(sample["tables"]) == set(TABLES)
    assert [p["when"] for p in result["explain"]] == [
        "before the hold",
        "hold, middle",
        "hold, end",
        "after the cool-down",
    ]
    for probe in result["explain"]:
        assert len(probe["plans"]) == 10
        assert all(plan["buffers"] > 0 for plan in probe["plans"].values())
    assert set(result["recovery"]["tables"]) == set(TABLES)


def test_the_controlled_commits_beside_a_snapshot_run_with_tiny_settings() -> None:
    schema = postgres_store_url().split("schema=", 1)[1]

    samples = commit_chain(shared_postgres_url(), schema, commits=8, every=4)

    assert [s["after"] for s in samples] == [
        "0 commits",
        "4 commits",
        "8 commits",
        "the snapshot's end",
        "VACUUM",
    ]
    for sample in samples:
        assert all(read["buffers"] > 0 for name, read in sample.items() if name != "after")

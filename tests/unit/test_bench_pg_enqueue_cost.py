"""bench/pg_enqueue_cost.py itself, with tiny settings on the suite's server so it cannot
rot: this checkout beside a baseline (here the same checkout), every operation measured,
the results JSON says so, and the schemas it made are dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def test_the_bench_measures_both_checkouts_side_by_side(tmp_path: Path) -> None:
    from bench import pg_enqueue_cost
    from bench.common import REPO

    server = postgres_store_url().split("?")[0]
    out = tmp_path / "cost.json"

    rc = pg_enqueue_cost.main(
        ["--dsn", server, "--n", "20", "--tenants", "3", "--hold-ms", "100", "--runs", "1",
         "--paused", "2", "--pause-s", "0.05",
         "--baseline", str(REPO), "--json", str(out)]
    )  # fmt: skip

    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    for name in ("this", "baseline"):
        (run,) = runs[name]
        for op in pg_enqueue_cost.OPERATIONS:
            assert run[op]["wall_ms"] > 0 and run[op]["cpu_ms"] >= 0, (name, op)
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'cost%'"
        ).fetchone()
    assert left == (0,)

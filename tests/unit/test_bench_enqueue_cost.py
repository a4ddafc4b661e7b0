"""bench/enqueue_cost.py on SQLite, with tiny settings so it cannot rot: this checkout
beside a baseline (here the same checkout), every operation measured, each enqueue loop's
per-call median given, and the store files it made removed."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def test_the_bench_measures_both_checkouts_side_by_side_on_sqlite(tmp_path: Path) -> None:
    from bench import enqueue_cost
    from bench.common import REPO

    out = tmp_path / "cost.json"
    before = set(Path(tempfile.gettempdir()).glob("enqueue-cost-*"))

    rc = enqueue_cost.main(
        ["--store", "sqlite", "--n", "20", "--tenants", "3", "--hold-ms", "50", "--runs", "1",
         "--paused", "2", "--pause-s", "0.05",
         "--baseline", str(REPO), "--json", str(out)]
    )  # fmt: skip

    assert rc == 0
    runs = json.loads(out.read_text())["runs"]
    for name in ("this", "baseline"):
        (run,) = runs[name]
        for op in enqueue_cost.OPERATIONS:
            assert run[op]["wall_ms"] > 0 and run[op]["cpu_ms"] >= 0, (name, op)
        assert run["enqueue"]["cpu_p50_ms"] >= 0 and run["enqueue_on"]["cpu_p50_ms"] >= 0
    assert set(Path(tempfile.gettempdir()).glob("enqueue-cost-*")) == before

"""The tenant-scale benchmark (issue 43 point 4) at a tiny size, so it cannot rot: it
builds its stores through the public API, runs every case on both and reports every
figure and target; a built store is reused from its cache."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from bench import tenant_scale, tenant_store
from quickzones.client import Quick
from quickzones.store.admin import active_zones, count_dead_letters


def test_the_big_store_has_what_the_bench_claims(tmp_path: Path) -> None:
    path, how = tenant_store.cached(30, 9, tmp_path)
    assert how["cached"] is False
    q = Quick.open(f"sqlite:///{path}")
    try:
        assert count_dead_letters(q, "a") == 30  # each tenant had an item once
        assert active_zones(q) == []  # and its zone is empty, its pointer collected
        assert len(q.weights()) == len(q.tenant_limits()) == len(q.paused()) == 3
    finally:
        q.close()
    with sqlite3.connect(path) as con:  # one file: the WAL folded in, so a copy is whole
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    again, how = tenant_store.cached(30, 9, tmp_path)
    assert (again, how["cached"]) == (path, True)


def test_a_tiny_run_reports_every_case_and_target(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--tenants", "40", "--settings", "12", "--runs", "1", "--many", "30"]
    argv += ["--requests", "2", "--noisy-window", "0.5", "--out", str(out)]
    assert tenant_scale.main([*argv, "--cache", str(tmp_path / "cache")]) == 0
    res = json.loads((out / "tenant_scale.json").read_text())
    assert (res["tenants"], res["settings"], res["dead_letters"]) == (40, 12, 40)
    for store in ("empty", "big"):
        s = res["summary"][store]
        assert s["drain_items_per_s"]["median"] > 0
        assert s["small_p99"]["median"] > 0
        assert s["many_over_lone"]["median"] > 0
        pages = res["pages"][store]["pages"]
        assert set(pages) == set(
            tenant_scale.tenant_pages.DASHBOARD + tenant_scale.tenant_pages.API
        )
        assert all(p["n"] == 2 for p in pages.values())
        assert res["pages"][store]["rss_after_mb"] > 0
    assert set(res["targets"]) == {
        "drain_rate_big_over_empty",
        "small_p99_big_over_empty",
        "pages_p99_under_100ms",
        "rss_growth_under_50mb",
        "many_tenants_at_least_half_lone",
    }

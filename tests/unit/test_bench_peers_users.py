"""``python -m bench.peers_users`` (issue 44 point 6), the harness whose table
docs/performance.md leads with, run small so it cannot rot: one producer's single
enqueues, a worker process spawned as a user runs it and timed from the spawn to the last
job's end, a noisy tenant's burst beside small tenants, delayed jobs; quick on SQLite
beside Huey, the figures, ratios and table written to the run's folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("huey")


def test_a_small_run_measures_what_users_see(tmp_path: Path) -> None:
    from bench import peers_users

    out = tmp_path / "run"
    rc = peers_users.main(
        ["--runs", "1", "--jobs", "200", "--only", "quick-sqlite,huey", "--out", str(out)]
    )
    assert rc == 0
    res = json.loads((out / "peers_users.json").read_text())
    assert res["sizes"]["jobs"] == 200
    assert set(res["systems"]) == {"quick-sqlite", "huey"}
    for name, system in res["systems"].items():
        assert "error" not in system, (name, system)
        # `quick worker --workers 4` as a user starts it; Huey's consumer with 4 threads.
        assert "--workers 4" in system["worker"] or "-w 4" in system["worker"], system
        (run,) = system["runs"]
        assert run["enqueue_per_s"] > 0
        # The drain: every job ran, timed from just before the spawn to the last job's
        # end, which comes after the last job's start.
        drain = run["drain"]
        assert drain["jobs"] == 200
        assert drain["spawn"] < drain["first_start"] <= drain["last_start"] <= drain["last_end"]
        assert drain["per_s"] == pytest.approx(200 / (drain["last_end"] - drain["spawn"]))
        noisy = run["noisy"]
        assert noisy["ran"] == noisy["expected"]
        assert noisy["small"]["n"] > 0 and noisy["noisy"]["n"] > 0
        assert math.isfinite(noisy["small"]["p99"])
        delayed = run["delayed"]
        assert delayed["n"] == delayed["expected"] == res["sizes"]["delayed"]
        assert delayed["early"] >= 0
        assert math.isfinite(delayed["p99"])
    assert "quickzones worker" in res["systems"]["quick-sqlite"]["worker"]
    # Medians of runs, and quick against the best peer, in a table printed and written.
    summary = res["summary"]["quick-sqlite"]
    assert (
        summary["drain_per_s"]["median"]
        == res["systems"]["quick-sqlite"]["runs"][0]["drain"]["per_s"]
    )
    ratios = res["ratios"]["quick-sqlite"]
    huey = res["summary"]["huey"]
    assert ratios["drain_per_s"]["peer"] == "huey"
    assert ratios["drain_per_s"]["ratio"] == pytest.approx(
        summary["drain_per_s"]["median"] / huey["drain_per_s"]["median"]
    )
    table = (out / "table.md").read_text()
    assert "| drain, worker spawn to last job's end |" in table
    assert "huey" in table.lower() and "quick (SQLite)" in table
    assert res["loadavg"]["before"] and res["loadavg"]["after"]


def test_runs_alternate_the_order_of_the_systems() -> None:
    from bench.peers_users import order_of_run

    systems = ["a", "b", "c"]
    assert [order_of_run(systems, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_every_system_starts_from_bytecode_as_a_wheel_install_would() -> None:
    """An editable checkout under PYTHONDONTWRITEBYTECODE never writes quick's bytecode,
    so each ``quick worker`` the drain spawned compiled all of quick while the peers,
    installed from wheels, loaded theirs: the sitting compiles quick's (and each peer's)
    first."""
    import importlib.util
    import sys

    from bench.common import compile_bytecode
    from bench.peers_users import PEER_PACKAGES

    done = compile_bytecode(PEER_PACKAGES)
    for module in ("quickzones.consumer.runtime", "quickzones.backends.sqlite.store"):
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        cached = importlib.util.cache_from_source(spec.origin)
        assert Path(cached).is_file(), cached
    assert any(Path(d).name in ("quick_core", "quickzones") for d in done), done
    assert sys.modules["bench.peers_users"].PEER_PACKAGES == PEER_PACKAGES


def test_a_pg_flush_delay_holds_each_durable_commit_on_the_benchmarks_server() -> None:
    """``--pg-flush-delay-ms``: the private server runs with ``commit_delay`` (and
    ``commit_siblings`` 0, so every durable commit waits), as a slower disk would."""
    from bench import peers_users
    from quickzones.testing.provision.postgres import postgres_skip_reason

    if postgres_skip_reason() is not None:
        pytest.skip(str(postgres_skip_reason()))
    psycopg = pytest.importorskip("psycopg")
    with peers_users._servers(["quick-postgres"], 2.5) as urls, psycopg.connect(
        urls["postgres"]
    ) as conn:
        assert conn.execute("SHOW commit_delay").fetchone() == ("2500",)
        assert conn.execute("SHOW commit_siblings").fetchone() == ("0",)


def test_a_pg_flush_delay_past_commit_delays_limit_is_refused() -> None:
    from bench import peers_users

    with pytest.raises(SystemExit):
        peers_users.main(["--pg-flush-delay-ms", "150", "--only", "quick-postgres"])

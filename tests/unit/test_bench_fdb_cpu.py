"""The FoundationDB CPU-per-item bench (issue 44 point 5) itself: a run drains every item
it enqueued in a child consumer process, reports that process's CPU and each thread's,
and reads the server's write and commit counters around the drain; py-spy's raw stacks
are summed by function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fdb_cpu
from tests.conftest import HAVE_FDB


def test_raw_stacks_are_summed_by_function_own_and_with_callees() -> None:
    raw = "\n".join(
        [
            "run (a.py:1);visit (b.py:2);get (c.py:3) 5",
            "run (a.py:1);visit (b.py:2) 3",
            "run (a.py:1);other (d.py:4);get (c.py:3) 2",
        ]
    )
    text = fdb_cpu.summed_profile(raw)
    assert text.startswith("10 samples with the GIL")
    own, _, total = text.partition("with callees")
    assert "    7  70.0 get (c.py:3)" in own
    assert "    3  30.0 visit (b.py:2)" in own
    assert "   10 100.0 run (a.py:1)" in total
    assert "    8  80.0 visit (b.py:2)" in total


@pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")
def test_a_run_drains_its_items_in_a_child_and_counts_the_servers_writes(tmp_path: Path) -> None:
    # --query reaches this tree's URL: an option A/B (here the default's value).
    argv = ["--items", "40", "--runs", "1", "--tenants", "4", "--query", "snapshot_reads=1"]
    assert fdb_cpu.main([*argv, "--out", str(tmp_path)]) == 0

    res = json.loads((tmp_path / "fdb_cpu.json").read_text())
    (run,) = res["runs"]["4"]["this"]
    assert run["items"] == 40
    assert 0 < run["visits"] <= 40
    assert run["cpu_s"] > 0 and run["cpu_s_per_1000"] > 0
    assert "fdb-network-thread" in run["thread_cpu_s"]
    # Every drained item is at least deleted (its record and index entry) and committed.
    assert run["writes_per_item"] >= 2
    assert run["commits_per_item"] > 0
    assert res["medians"]["4"]["this"]["writes_per_item"] == run["writes_per_item"]

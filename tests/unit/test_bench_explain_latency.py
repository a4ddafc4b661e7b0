"""``bench.explain_latency`` at a small size: every case it builds names the rule it was
built for (the bench asserts it), and it writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

from bench import explain_latency


def test_each_case_names_its_rule_and_the_figures_are_written(tmp_path: Path) -> None:
    argv = ["--stores", "sqlite", "--tenants", "5", "--items", "5", "--calls", "3"]
    assert explain_latency.main([*argv, "--cli-runs", "1", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "explain_latency.json").read_text())
    cases = out["stores"]["sqlite"]["cases"]
    assert {c["rule"] for c in cases.values()} == {r for *_, r in explain_latency.CASES}
    assert all(c["n"] == 3 and c["p99"] >= c["p50"] > 0 for c in cases.values())
    assert out["stores"]["sqlite"]["cli"]["n"] == 1
    assert "| tenant cap full | tenant_cap |" in (tmp_path / "table.md").read_text()

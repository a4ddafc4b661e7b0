"""``bench.fdb_txn_cost`` (issue 44 point 5): each variant runs in a child process of its
own and reports the CPU and wall time one transaction costs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fdb_txn_cost
from tests.conftest import HAVE_FDB


@pytest.mark.skipif(not HAVE_FDB, reason="needs a FoundationDB cluster")
def test_each_variant_reports_a_transactions_cost(tmp_path: Path) -> None:
    variants = "read,read_grvcache,write_setrv,write_reset"
    argv = ["--txns", "20", "--runs", "1", "--variants", variants, "--out", str(tmp_path)]
    assert fdb_txn_cost.main(argv) == 0
    res = json.loads((tmp_path / "fdb_txn_cost.json").read_text())
    assert set(res["medians"]) == set(variants.split(","))
    for medians in res["medians"].values():
        assert medians["cpu_us"] > 0 and medians["wall_us"] > 0

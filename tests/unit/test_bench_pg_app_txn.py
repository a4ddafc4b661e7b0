"""The application-transaction benchmark on PostgreSQL (issue 42) itself, with tiny settings
on the suite's server so it cannot rot: both transaction variants commit, a real ``quick
worker`` starts every item the quick variant committed (the pickup figures are over all of
them, none missing), the single producer enqueues, and the results JSON says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def test_the_bench_runs_both_variants_and_every_committed_item_is_picked_up(
    tmp_path: Path,
) -> None:
    from bench import pg_app_txn

    store = postgres_store_url()  # the suite's server, and a schema name no other test uses
    server, schema = store.split("?")[0], store.split("schema=")[1]
    out = tmp_path / "pg_app_txn.json"

    rc = pg_app_txn.main(
        ["--dsn", server, "--prefix", schema, "--seconds", "0.5", "--threads", "2",
         "--work-ms", "5", "--runs", "1", "--no-procrastinate", "--json", str(out)]
    )  # fmt: skip

    assert rc == 0
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    case = run["cases"]["w5"]
    for variant in ("quick", "baseline"):
        tx = case[variant]
        assert tx["committed"] > 0 and tx["errors"] == 0, (variant, tx)
        assert tx["latency_ms"]["p50"] <= tx["latency_ms"]["p99"]
    pickup = case["quick"]["pickup"]
    assert pickup["started"] == case["quick"]["committed"]  # every committed item ran
    assert pickup["from_enqueue_ms"]["n"] == pickup["started"]
    assert run["single_producer"]["quick"]["jobs"] > 0
    assert "procrastinate" not in run["single_producer"]
    assert doc["medians"]["w5"]["quick_tx_s"] > 0
    # The run drops the schemas it made on a server it did not start.
    import psycopg

    with psycopg.connect(server) as conn:
        left = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE %s",
            (f"{schema}_%",),
        ).fetchone()
    assert left == (0,)

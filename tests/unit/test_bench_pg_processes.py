"""``bench.pg_processes`` itself, with tiny settings, so it cannot rot: one-call enqueues
then a real ``quick worker --processes 2`` drain on the tests' PostgreSQL, with the
server's CPU and transactions an item, and the round trips an item through the counting
proxy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.pg_processes import drain, round_trips
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)


def test_the_processes_bench_drains_and_counts_with_tiny_settings(tmp_path: Path) -> None:
    dsn = shared_postgres_url()
    got = drain(dsn, postgres_store_url() + "&zones=sql", 2, 40, 4, tmp_path)
    assert got["processes"] == 2 and got["items_per_s"] > 0
    assert got["server_cpu_ms_per_item"] > 0 and got["transactions_per_item"] > 0
    trips = round_trips(dsn, postgres_store_url() + "&zones=sql", 1, 40, 4, tmp_path)
    assert math.isfinite(trips) and trips > 0

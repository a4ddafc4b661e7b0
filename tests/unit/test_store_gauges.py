"""The store's gauges a worker's ``--metrics-port`` serves (``quick_queue_depth``,
``quick_oldest_vested_age_seconds``, ``quick_pointers``) cost a bounded read per scrape,
whatever the number of active zones (issue 43: a consumer's work must not grow with the
number of tenants). Before, every scrape of every worker read every active zone's pointer
and count, one transaction per zone: a million active tenants made each scrape a million
transactions, and Prometheus scrapes each worker every 15 s."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer.metrics import StoreCollector
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV

pytest.importorskip("prometheus_client")


def _values(families: list[Any]) -> dict[tuple[str, tuple[str, ...]], float]:
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for family in families:
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.values())))] = sample.value
    return out


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def counted() -> Any:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    yield q, kv
    q.close()


def test_a_scrape_reads_at_most_its_budget_of_zones_and_says_it_is_partial(counted: Any) -> None:
    q, kv = counted
    for i in range(600):
        q.enqueue("j", {}, app="big", tenant=f"t{i:04}")
    q.enqueue_many("j", [{}, {}, {}], app="small", tenant="only")
    clock = _Clock()
    full = _values(list(StoreCollector(q, max_zones=1_000, now=clock).collect()))
    assert full[("quick_queue_depth", ("big",))] == 600
    assert full[("quick_queue_depth", ("small",))] == 3
    assert full[("quick_pointers", ("0",))] == 601
    assert full[("quick_store_gauges_complete", ())] == 1

    kv.keys_read = kv.reads = kv.transactions = 0
    partial = _values(list(StoreCollector(q, max_zones=100, now=clock).collect()))
    # 100 pointer records and their 100 counts, not 601 of each (plus the layout's keys).
    assert kv.keys_read <= 2 * 100 + 10, kv.keys_read
    assert kv.transactions <= 10, kv.transactions  # a chunk of zones' counts in one
    assert partial[("quick_store_gauges_complete", ())] == 0
    # What it read, a lower bound: 100 zones in pointer-id order (random), one of which may
    # be small's 3 items.
    depth = partial[("quick_queue_depth", ("big",))]
    read = depth + partial.get(("quick_queue_depth", ("small",)), 0)
    assert read in (100, 102), partial
    assert partial[("quick_pointers", ("0",))] == 100


def test_scrapes_within_the_refresh_interval_reuse_the_last_reading(counted: Any) -> None:
    q, kv = counted
    for i in range(20):
        q.enqueue("j", {}, app="a", tenant=f"t{i}")
    clock = _Clock()
    collector = StoreCollector(q, refresh_s=15.0, now=clock)
    first = _values(list(collector.collect()))
    kv.keys_read = kv.reads = 0
    q.enqueue("j", {}, app="a", tenant="new")
    clock.t += 14.0
    assert _values(list(collector.collect())) == first
    assert kv.reads == 0  # no store read at all
    clock.t += 2.0
    assert _values(list(collector.collect()))[("quick_queue_depth", ("a",))] == 21
    assert kv.reads > 0


def test_bad_bounds_are_refused(counted: Any) -> None:
    q, _ = counted
    with pytest.raises(ValueError, match="max_zones"):
        StoreCollector(q, max_zones=0)
    with pytest.raises(ValueError, match="refresh_s"):
        StoreCollector(q, refresh_s=-1)

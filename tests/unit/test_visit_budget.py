"""A visit fits the store (issue 40, point 3).

The complaint: 16 workers and 60 KB payloads on FoundationDB, and 0 of 300 items ran in
30 s. A lease rewrites an item's record, and a record keeps a payload of up to 64 KB
inline, so a visit that leased a consumer's whole free capacity (16 x 16 items) wrote
about 15 MB in one transaction, past the store's 10 MB: every visit was refused, and the
next one was the same. A visit's transaction is now bounded in bytes and keys
(:mod:`quickzones.store.zones.visit_budget`) whatever the payloads, and always takes at
least one item, so a single huge item still runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.records import ZoneId
from quickzones.store.zones.budget import TransactionBudget
from tests.conftest import HAVE_FDB, store_url
from tests.waiting import wait_for

PAYLOAD = 60 * 1024
# Today's default held bound for 16 workers (16 a worker), set explicitly so the test
# keeps its meaning whatever the default becomes.
WORKERS = 16
BOUND = 16 * WORKERS


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else []),
    ]
)
def big_q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quick]:
    """A client on the system clock over the real FoundationDB (and the stores whose
    transactions enforce the same 10 MB: memory, SQLite)."""
    quick = Quick.open(store_url(str(request.param), tmp_path))
    yield quick
    quick.close()


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        self.seen.append((event, fields))

    def fields(self, name: str) -> list[dict[str, Any]]:
        return [f for event, f in self.seen if event == name]


def _run(q: Quick, config: ConsumerConfig, expected: int, events: _Events) -> Counter[str]:
    consumer = q.consumer(config, observer=events)
    consumer.start()
    try:
        wait_for(lambda: len(_RAN) >= expected, timeout=60)
    finally:
        consumer.stop()
    return Counter(_RAN)


_RAN: list[str] = []


@pytest.fixture(autouse=True)
def _reset_ran() -> None:
    _RAN.clear()


def _job(q: Quick) -> None:
    q.job("big")(lambda payload, ctx: _RAN.append(ctx.item_id))


def test_sixteen_workers_drain_large_payloads(big_q: Quick) -> None:
    q = big_q
    _job(q)
    payload = b"x" * PAYLOAD
    ids = [q.enqueue("big", payload, app="app", tenant="t") for _ in range(300)]
    events = _Events()
    config = ConsumerConfig(workers=WORKERS, processing_bound=BOUND, idle_sleep_s=0.01)
    ran = _run(q, config, len(ids), events)
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}
    # Visits stopped at the budget, not at the free capacity.
    assert events.fields("visit_budget_reached")


def test_a_batch_of_zones_with_large_items_runs(big_q: Quick) -> None:
    q = big_q
    _job(q)
    payload = b"y" * PAYLOAD
    ids = [q.enqueue("big", payload, app="app", tenant=f"t{n % 6}") for n in range(240)]
    events = _Events()
    config = ConsumerConfig(
        workers=WORKERS,
        processing_bound=BOUND,
        one_transaction_visits=True,
        visits_per_transaction=4,
        selection_frac=1.0,
        idle_sleep_s=0.01,
    )
    ran = _run(q, config, len(ids), events)
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}


def test_one_item_larger_than_the_budget_still_runs(big_q: Quick) -> None:
    q = big_q
    _job(q)
    # Chunked (above 64 KB), and larger than the whole visit budget.
    huge = b"z" * 1_040_000  # near the 1 MiB payload limit
    ids = [q.enqueue("big", huge, app="app", tenant="t") for _ in range(3)]
    events = _Events()
    config = ConsumerConfig(workers=4, processing_bound=64, idle_sleep_s=0.01)
    ran = _run(q, config, len(ids), events)
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}


def test_a_dequeue_stops_at_its_budget_and_leaves_the_rest_vested(q: Quick) -> None:
    zone = ZoneId("app", "t")
    for _ in range(10):
        q.enqueue("big", b"w" * PAYLOAD, app="app", tenant="t")
    budget = TransactionBudget(max_bytes=300_000)
    # Each leased record of 60 KB is read and written again: about 123 KB an item.
    taken, _ = q.zones.dequeue(zone, 10, 60_000, budget=budget)
    assert len(taken) == 2 and budget.reached
    # The rest is vested and the next dequeue takes it; the default budget fits 8.
    rest, _ = q.zones.dequeue(zone, 10, 60_000)
    assert len(rest) == 8


def test_a_budget_of_one_byte_still_takes_one_item(q: Quick) -> None:
    zone = ZoneId("app", "t")
    for _ in range(3):
        q.enqueue("big", b"v" * PAYLOAD, app="app", tenant="t")
    budget = TransactionBudget(max_bytes=1)
    taken, _ = q.zones.dequeue(zone, 3, 60_000, budget=budget)
    assert len(taken) == 1 and budget.reached
    # Joining the same transaction's budget, another dequeue takes nothing more.
    more, _ = q.zones.dequeue(zone, 3, 60_000, budget=budget)
    assert more == []

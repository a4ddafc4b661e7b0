"""Work-conserving visits (issue 15 point 7): a tenant alone in the queue drains at the
consumer's full speed. With ``visit_max`` set, a visit takes the water-filling share of
the consumer's free capacity (never less than ``dequeue_max``, never more than
``visit_max``, where set), so fairness holds when tenants compete and costs nothing when
they do not. With ``visit_max=dequeue_max``, every visit stays at ``dequeue_max``
(invariant 7)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError
from quickzones.store.records import ZoneId


def _noop(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)


def test_a_lone_tenant_gets_more_than_dequeue_max_when_workers_are_free(q: Quick) -> None:
    _noop(q)
    q.enqueue_many("job", [b""] * 60, app="app", tenant="alone")
    consumer = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=10, visit_max=1000, processing_bound=256)
    )
    [ref] = consumer.scan_once()
    works = consumer.visit(ref)
    assert len(works) == 60
    for w in works:
        consumer.execute(w)
    assert q.zones.count(ZoneId("app", "alone")) == 0


def test_a_visit_never_takes_more_than_the_free_capacity_or_visit_max(q: Quick) -> None:
    _noop(q)
    q.enqueue_many("job", [b""] * 60, app="app", tenant="alone")
    capped = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=5, visit_max=1000, processing_bound=25)
    )
    [ref] = capped.scan_once()
    assert len(capped.visit(ref)) == 25  # the processing bound still holds
    q2 = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=5, visit_max=20, processing_bound=256), name="b"
    )
    [ref] = q2.scan_once()
    assert len(q2.visit(ref)) == 20


def test_competing_tenants_share_the_free_capacity_equally(q: Quick) -> None:
    _noop(q)
    for t in range(4):
        q.enqueue_many("job", [b""] * 100, app="app", tenant=f"t{t}")
    consumer = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=10, visit_max=1000, processing_bound=200)
    )
    refs = consumer.scan_once()
    assert len(refs) == 4
    assert [len(consumer.visit(ref)) for ref in refs] == [50, 50, 50, 50]


def test_many_competing_tenants_keep_visits_at_dequeue_max(q: Quick) -> None:
    _noop(q)
    for t in range(40):
        q.enqueue_many("job", [b""] * 20, app="app", tenant=f"t{t:02d}")
    consumer = q.consumer(
        ConsumerConfig(
            in_order=True, dequeue_max=5, visit_max=1000, processing_bound=100, selection_max=40
        )
    )
    sizes: list[int] = []
    for ref in consumer.scan_once():
        works = consumer.visit(ref)
        sizes.append(len(works))
        for w in works:
            consumer.execute(w)
    assert sizes and set(sizes) == {5}  # 100 free slots over 40 zones: dequeue_max wins


def test_visit_max_at_dequeue_max_keeps_every_visit_at_dequeue_max(q: Quick) -> None:
    _noop(q)
    q.enqueue_many("job", [b""] * 60, app="app", tenant="alone")
    consumer = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=10, visit_max=10, processing_bound=256)
    )
    [ref] = consumer.scan_once()
    assert len(consumer.visit(ref)) == 10


def test_visit_max_below_dequeue_max_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="visit_max"):
        ConsumerConfig(dequeue_max=10, visit_max=5).validate()


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_lone_tenant_drains_in_big_visits_on_a_running_consumer(
    backend: str, tmp_path: Any
) -> None:
    from tests.conftest import store_url

    q = Quick.open(store_url(backend, tmp_path))
    try:
        _noop(q)
        q.enqueue_many("job", [b""] * 500, app="app", tenant="alone")
        sizes: list[int] = []

        def observe(event: str, fields: dict[str, Any]) -> None:
            if event == "visited":
                sizes.append(fields["items"])

        consumer = q.consumer(
            # A prefetch beyond the 4 workers: what a big visit is for.
            ConsumerConfig(
                dequeue_max=10, visit_max=1000, workers=4, in_order=False, processing_bound=256
            ),
            observer=observe,
        )
        consumer.start()
        try:
            deadline = time.monotonic() + 60
            while consumer.stats["completed"] < 500 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            consumer.stop()
        assert consumer.stats["completed"] == 500
        assert max(sizes) > 10
        assert q.zones.count(ZoneId("app", "alone")) == 0
    finally:
        q.close()

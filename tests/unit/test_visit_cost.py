"""What a lone tenant's backlog costs in visits with the defaults a user gets (issue 29
point 3): a visit (a scan, the pointer's lease, the dequeue, the pointer's requeue) cost
about as much CPU as ten no-op items, and with ``ConsumerConfig()`` every visit took
``dequeue_max`` (10) items, so ``quick worker --workers 4`` spent half of each item's CPU
on visits. Now a tenant alone fills the consumer's free room (``processing_bound``) in one
visit; when zones compete, visits stay at ``dequeue_max``
(``tests/unit/test_work_conserving.py``), and ``visit_max=dequeue_max`` keeps the paper's
visits. Since issue 40 the default room is the workers (nothing waits for a worker), so a
look-ahead of 16 per worker is asked for here (``LOOK_AHEAD``) where the visits' size is
what is measured."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.records import ZoneId
from tests.conftest import store_url

N = 640
LOOK_AHEAD = 4 * 16  # processing_bound: 16 per worker of 4 (the default before issue 40)


def _noop(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)


def test_a_lone_backlog_takes_a_visit_per_free_room_not_per_dequeue_max(q: Quick) -> None:
    """Before: 64 visits for 640 items (10 each) on every backend; now 10 (64 each)."""
    _noop(q)
    q.enqueue_many("job", [b""] * N, app="app", tenant="alone")
    consumer = q.consumer(ConsumerConfig(workers=4, processing_bound=LOOK_AHEAD))
    assert consumer.run_until_idle() == N
    assert consumer.stats["visited"] == N // LOOK_AHEAD
    assert q.zones.count(ZoneId("app", "alone")) == 0


def test_a_running_consumer_drains_a_lone_backlog_in_visits_of_its_free_room(
    backend: str, tmp_path: Path
) -> None:
    """The threaded consumer, as ``quick worker --workers 4`` runs it: before, 64 visits
    of at most 10 items for 640 items; now fewer than half as many (the free room when a
    visit starts varies with the workers' pace)."""
    q = Quick.open(store_url(backend, tmp_path))
    try:
        _noop(q)
        q.enqueue_many("job", [b""] * N, app="app", tenant="alone")
        sizes: list[int] = []

        def observe(event: str, fields: dict[str, Any]) -> None:
            if event == "visited":
                sizes.append(fields["items"])

        config = ConsumerConfig(workers=4, processing_bound=LOOK_AHEAD)
        consumer = q.consumer(config, observer=observe)
        consumer.start()
        try:
            deadline = time.monotonic() + 120
            while consumer.stats["completed"] < N and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            consumer.stop()
        assert consumer.stats["completed"] == N
        took = [s for s in sizes if s]
        assert sum(took) == N
        assert len(took) < N // 10 // 2, f"{len(took)} visits: {took}"
        assert q.zones.count(ZoneId("app", "alone")) == 0
    finally:
        q.close()


"""The completion flusher's pace (``completion_flush_s``): under load, completions wait up
to that long and go in one commit together, instead of a commit per handful; each commit
competes with the visits for the store's write lock and the interpreter. A stop still
completes everything finished, at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError
from tests.waiting import wait_for


def _run(q: Quick, n: int, config: ConsumerConfig) -> tuple[int, float]:
    """Run ``n`` items (5 ms each, 4 workers); returns (flushes that completed some, s)."""
    q.job("j")(lambda payload, ctx: time.sleep(0.005))
    flushes = 0
    lock = threading.Lock()

    def observer(event: str, fields: dict[str, Any]) -> None:
        nonlocal flushes
        if event == "completions_flushed":
            with lock:
                flushes += 1

    q.enqueue_many("j", list(range(n)), app="a", tenant="t")
    consumer = q.consumer(config, observer=observer)
    began = time.monotonic()
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["completed"] == n, timeout=60)
        elapsed = time.monotonic() - began
    finally:
        consumer.stop(5)
    assert q.zones.count(q.zone("a", "t")) == 0
    return flushes, elapsed


def test_completions_are_committed_at_the_flush_pace(real_q: Quick) -> None:
    flushes, elapsed = _run(real_q, 200, ConsumerConfig(workers=4, completion_flush_s=0.1))
    assert flushes <= elapsed / 0.1 + 2, (flushes, elapsed)


def test_a_stop_completes_what_finished_without_waiting_for_the_pace(real_q: Quick) -> None:
    real_q.job("j")(lambda payload, ctx: None)
    item = real_q.enqueue("j", 1, app="a", tenant="t")
    consumer = real_q.consumer(ConsumerConfig(completion_flush_s=30))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["started"] == 1)
    finally:
        began = time.monotonic()
        consumer.stop(5)
    assert time.monotonic() - began < 10  # not the 30 s pace
    status = real_q.status("a", "t", item)
    assert status is None or status.state == "completed"
    assert real_q.zones.count(real_q.zone("a", "t")) == 0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_a_negative_or_unbounded_pace_is_refused(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="completion_flush_s"):
        ConsumerConfig(completion_flush_s=bad).validate()


def test_completions_handed_over_together_by_many_workers_all_commit_in_batches(
    real_q: Quick,
) -> None:
    """Workers hand finished items to the flusher, which a batch wakes once (issue 29
    point 3): none may be left waiting for a wake-up that never comes, and they still
    commit in batches, not one commit each."""
    flushes, _ = _run(real_q, 400, ConsumerConfig(workers=8))
    assert 0 < flushes < 400

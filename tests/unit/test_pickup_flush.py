"""Issue 41 point 14d: the pickup-count flush (a consumer's counts for the fairness view,
added to the store every few seconds) retries what failed and counts nothing twice.

Faults come through the memory store's constructor hook (``commit_hook``), which sees
every commit: a flush whose commit applied but whose answer was lost
(``commit_unknown_result``, retried by the store's retry loop) added its counts twice; and
the counts a failing flush kept were merged with the next ones into one transaction that
grew with every failure, until, past the store's transaction size (10 MB), no flush could
ever commit again and the counts stuck in memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.pickups import PickupCounts
from quickzones.errors import StoreBusy
from quickzones.store import pickups
from quickzones.store.kv import COMMIT_UNKNOWN_RESULT, KVError
from quickzones.store.records import ZoneId

Commit = Callable[[Any], tuple[int, int]]


class PickupFaults:
    """A commit hook that makes the next ``lost`` pickup flushes apply but lose their
    answer, and refuses the next ``refused`` ones (the store busy), before they apply."""

    def __init__(self, *, lost: int = 0, refused: int = 0) -> None:
        self.lost, self.refused = lost, refused

    def __call__(self, request: Any, commit: Commit) -> tuple[int, int]:
        if not any(b"pickup" in key for key in request.atomic_keys()):
            return commit(request)
        if self.refused:
            self.refused -= 1
            raise StoreBusy("memory://", 5_000)  # injected: the store refused the flush
        if self.lost:
            self.lost -= 1
            commit(request)
            raise KVError(COMMIT_UNKNOWN_RESULT, "injected: applied, its answer lost")
        return commit(request)


def _picked(q: Quick) -> dict[str, int]:
    found = pickups.tenant_pickups(q.kv, q.keys, "a", now_ms(q.clock))
    return {tenant: h.total for tenant, h in found.items()}


def test_a_flush_whose_answer_was_lost_counts_once() -> None:
    clock = ManualClock()
    faults = PickupFaults(lost=1)
    q = Quick(MemoryStore(clock=clock, commit_hook=faults), clock=clock)
    q.job("j")(lambda payload, ctx: None)
    for n in range(12):
        q.enqueue("j", n, app="a", tenant=f"t{n % 3}")
    consumer = q.consumer(ConsumerConfig(in_order=True), name="c")
    consumer.run_until_idle()
    consumer.heartbeats.beat_once()  # its commit applied, its answer lost: retried
    assert faults.lost == 0
    assert _picked(q) == {"t0": 4, "t1": 4, "t2": 4}  # before: 8 each
    q.enqueue("j", 99, app="a", tenant="t0")
    consumer.run_until_idle()
    consumer.heartbeats.beat_once()
    assert _picked(q) == {"t0": 5, "t1": 4, "t2": 4}
    q.close()


def test_a_refused_flush_is_retried_as_it_was_and_lands_once() -> None:
    clock = ManualClock()
    faults = PickupFaults(refused=3)
    q = Quick(MemoryStore(clock=clock, commit_hook=faults), clock=clock)
    counts = PickupCounts()
    store = [("default", q.kv, q.keys)]
    now = now_ms(clock)
    for flush in range(4):
        for tenant in ("x", "y"):
            counts.dequeued(zone=ZoneId("a", tenant), enqueued_ms=now, pickup_ms=now,
                            cluster="default")  # fmt: skip
        counts.flush(store, now)
        if flush < 3:
            assert _picked(q) == {}, "the store refused it"
    assert faults.refused == 0
    assert _picked(q) == {"x": 4, "y": 4}
    counts.flush(store, now)  # nothing left over
    assert _picked(q) == {"x": 4, "y": 4}
    q.close()


def test_counts_kept_through_an_outage_still_fit_a_transaction() -> None:
    """20,000 tenants with long names picked up while the store was away: more than one
    transaction holds (10 MB). Before, every flush failed with TransactionTooLarge and the
    counts stayed in memory for good; now they go in transactions of a bounded size."""
    clock = ManualClock()
    faults = PickupFaults(refused=1)
    q = Quick(MemoryStore(clock=clock, commit_hook=faults), clock=clock)
    counts = PickupCounts()
    store = [("default", q.kv, q.keys)]
    now = now_ms(clock)
    long = "t" * 190
    n = 20_000
    for i in range(n):
        counts.dequeued(zone=ZoneId("a", f"{long}{i:06d}"), enqueued_ms=now, pickup_ms=now,
                        cluster="default")  # fmt: skip
    counts.flush(store, now)  # the store is away: kept
    counts.flush(store, now)
    counts.flush(store, now)
    [(_, minute)] = pickups.app_history(q.kv, q.keys, "a", now, minutes=1)
    assert minute.total == n
    assert sum(_picked(q).values()) == n
    q.close()

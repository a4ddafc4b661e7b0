"""``Consumer.run_until_idle``: Algorithms 1-3 driven on the caller's thread, a round at a
time (scan, visit, run, complete), for tests, the simulator and ``quick demo``'s CPU bench."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quickzones.consumer.pool import in_turn
from quickzones.consumer.set_aside import VisitFailures
from quickzones.consumer.state import START_CHECK_AFTER_S, Work

if TYPE_CHECKING:
    from quickzones.consumer.runtime import Consumer


def drain_until_idle(consumer: Consumer, max_rounds: int) -> int:
    """What :meth:`Consumer.run_until_idle` says it does; returns the items run."""
    done = 0
    idle: set[tuple[str, int, str]] | None = None

    def fresh(works: list[Work]) -> None:
        # Run right after their dequeue, which is their start check while it is recent
        # and their leases long (Worker._dequeue_was_check): no read per item.
        until = time.monotonic() + START_CHECK_AFTER_S
        for work in works:
            if work.due_ms is None:
                work.fresh_until = until

    renew_at: float | None = None
    for _ in range(max_rounds):
        # The scanner lease is renewed as the threaded scanner renews it, every third
        # of its TTL (not each round: a store transaction a round), and at once when
        # it is not held (to take it). On the consumer's clock: the leases' own.
        now = consumer.clock.now()
        held = all(consumer.in_order_for(cluster) for cluster in consumer.clusters)
        if renew_at is None or now >= renew_at or not held:
            consumer.refresh_election()
            renew_at = now + consumer.config.election_ttl_s / 3
        refs = consumer.scan_once()
        if not refs:
            break
        consumer._batching, size = True, consumer.config.visits_at_once()
        failures = VisitFailures(consumer.scanner.set_aside)
        try:
            # Run as the pool's lanes run them (zones in turn): a visit may bring a
            # backlog's whole free room, and a small zone waits behind one of its items.
            works: list[Work] = []
            for i in range(0, len(refs), size):
                visited = consumer.manager.visit_many(refs[i : i + size], failed=failures.failed)
                fresh(visited)
                works += visited
            if not works:
                failures.store_failing(zones=1)
            for work in in_turn(works, lambda w: (w.cluster, w.zone)):
                consumer.execute(work)
            consumer.flush_completions()
        finally:
            consumer._batching = False
        done += len(works)
        if works:
            idle = None
            continue
        seen = {(ref.cluster, ref.shard, ref.pointer_id) for ref in refs}
        if idle is not None and seen <= idle:
            break
        idle = seen
    return done

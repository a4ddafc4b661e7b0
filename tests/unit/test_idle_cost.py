"""An idle ``quick worker`` costs (next to) nothing, and still starts a lone item at once
(issue 44 point 4): a real ``quick worker --workers 4`` process with its defaults, idle
for 10 s, then an item enqueued from this process.

Before: the idle scanner peeked every 20 ms (``idle_sleep_s``) and read the store's commit
counter every 5 ms (``commit_poll_s``): 0.5-0.9 CPU seconds over 10 idle seconds on
SQLite (5-9 % of a core) on this 2-core machine. The target is at most 0.5 % of a core,
0.05 s over 10 s. The bound, 0.2 s (2 % of a core), sits between the two with a margin
each way: today's code fails it by 3x or more, and a worker at the target passes it with
4x room for a loaded, shared machine (CPU seconds are the worker's own, so other load
moves them little, but it does stretch each wake-up's work).

The pickup bound (1 s) is a behaviour bound, not a benchmark: an idle worker that only
polled at its safety poll (a third of ``election_ttl_s``, 1.7 s) would miss it half the
time or more, so it says the store's own signal woke it; the same for a delayed item's start.
bench/idle_cost.py measures the same with figures (docs/performance.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.idle_cost import idle_worker, pickup_s
from quickzones.client import Quick
from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url
from tests.waiting import wait_for

IDLE_SPAN_S = 10.0
IDLE_CPU_BOUND_S = 0.2  # 2 % of a core over the span (see the module's docstring)
PICKUP_BOUND_S = 1.0
DELAY_S = 0.7  # shorter than the safety poll (2 s)


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param(
            "postgres", marks=pytest.mark.skipif(not HAVE_POSTGRES, reason="no PostgreSQL")
        ),
        # FoundationDB: a watch on the key that enqueues bump (backends/fdb/wake_watch.py).
        pytest.param("fdb", marks=pytest.mark.skipif(not HAVE_FDB, reason="no FoundationDB")),
    ],
)
def test_an_idle_worker_costs_next_to_nothing_and_picks_up_at_once(
    backend: str, tmp_path: Path
) -> None:
    url = store_url(backend, tmp_path)
    producer = Quick.open(url)
    producer.job("lone")(lambda payload, ctx: None)
    producer.store_type_policies()
    try:
        with idle_worker(tmp_path, url) as worker:
            # Its start-up done: a first item run end to end.
            pickup_s(worker, producer, "warm-up", timeout_s=60)
            assert wait_for(lambda: "warm-up" in worker.start_times())
            idle_cpu = worker.idle_cpu_s(IDLE_SPAN_S)
            # Another process's lone enqueue, after the long idle span.
            took = [pickup_s(worker, producer, f"lone{i}", timeout_s=60) for i in range(3)]
            # A delayed item enqueued while it idles starts at its time, not at the next
            # safety poll (its vesting time is what the wake-up's scan saw).
            # Its vesting time is taken inside the call, so no earlier than ``due``: an
            # enqueue that returns late (two transactions on FoundationDB, on a loaded
            # host) must not make a start on time look early.
            due = time.time() + DELAY_S
            producer.enqueue("lone", "delayed", app="idle", tenant="other", delay=DELAY_S)
            assert wait_for(lambda: "delayed" in worker.start_times())
            late = worker.start_times()["delayed"] - due
    finally:
        producer.close()
    assert -0.01 <= late < PICKUP_BOUND_S, f"the delayed item started {late:+.3f} s off its time"
    assert idle_cpu < IDLE_CPU_BOUND_S, (
        f"an idle quick worker used {idle_cpu:.3f} CPU seconds over {IDLE_SPAN_S:g} s"
    )
    assert max(took) < PICKUP_BOUND_S, f"lone items started {took} s after their enqueue"

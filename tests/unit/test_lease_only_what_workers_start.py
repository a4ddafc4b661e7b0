"""A consumer leases only what its free workers can start now (issue 40 point 2; paper
Algorithm 1, line 5).

A consumer with one worker, whose handler is stuck, and a second consumer with four idle
workers: the second runs every other item promptly, and the first never holds more than
its one worker started. On the unchanged code (``processing_bound`` 16 x workers) the
stuck consumer's first visit leased 16 items, renewed their leases while its one worker
stayed stuck, and the second consumer ran 4 of 19.
"""

from __future__ import annotations

import threading
from pathlib import Path

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.waiting import wait_for

ITEMS = 19


def test_a_stuck_consumer_leaves_the_rest_to_idle_workers(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    stuck = threading.Event()
    release = threading.Event()
    lock = threading.Lock()
    ran: list[str] = []

    @q.job("job")
    def job(payload: object, ctx: JobContext) -> None:
        if payload == "stuck":
            stuck.set()
            release.wait(120)
            return
        with lock:
            ran.append(ctx.item_id)

    # The stuck item first: the first consumer's first visit takes it, with whatever
    # else that visit leases.
    q.enqueue("job", "stuck", app="a", tenant="t")
    others = {q.enqueue("job", n, app="a", tenant="t") for n in range(ITEMS)}
    first = q.consumer(ConsumerConfig(workers=1, idle_sleep_s=0.01))
    second = q.consumer(ConsumerConfig(workers=4, idle_sleep_s=0.01))
    held: list[int] = []
    first.start()
    try:
        assert wait_for(stuck.is_set, timeout=60), "the stuck handler never started"
        held.append(first.in_flight())
        second.start()
        try:

            def all_ran() -> bool:
                held.append(first.in_flight())
                with lock:
                    return set(ran) == others

            finished = wait_for(all_ran, timeout=30)
            with lock:
                count = len(set(ran))
            assert finished, f"the second consumer ran {count} of {ITEMS}"
        finally:
            second.stop()
    finally:
        release.set()
        first.stop()
        q.close()
    # The first consumer held its one stuck item and nothing else.
    assert max(held) == 1, f"the stuck consumer held up to {max(held)} items"

"""A consumer leases only what its free workers can start (paper Algorithm 1, line 5).

The reported reproduction: default settings but a 3 s item lease (the ratio of the default
30 s lease to 3 s handlers), 300 items whose handler never fails and sleeps 0.3 s. A
consumer that leased up to 256 items at once left most of them waiting in its local queue
while their leases ran out: on the unchanged code 28 were dead-lettered without ever
running and 141 ran as attempt 2 or 3, and a ``--workers 4`` process held 256 leased.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.conftest import store_url
from tests.waiting import wait_for

ITEMS = 300
HANDLER_S = 0.3
LEASE_S = 3.0


def test_no_item_waits_out_its_lease(backend: str, tmp_path: Path) -> None:
    if backend == "fdbsim":
        pytest.skip("the FDB backend's code is covered on the real cluster and memory")
    q = Quick.open(store_url(backend, tmp_path))
    runs: list[tuple[str, int]] = []
    held: list[int] = []
    lock = threading.Lock()
    consumer_box: list[Any] = []

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        with lock:
            runs.append((ctx.item_id, ctx.attempt))
            held.append(consumer_box[0].in_flight())
        time.sleep(HANDLER_S)

    ids = [q.enqueue("job", {"n": n}, app="a", tenant=f"t{n % 3}") for n in range(ITEMS)]
    config = ConsumerConfig(item_lease_s=LEASE_S)
    consumer = q.consumer(config)
    consumer_box.append(consumer)
    consumer.start()
    try:
        finished = wait_for(lambda: _left(q, ["t0", "t1", "t2"]) == 0, timeout=240)
    finally:
        consumer.stop()
    dead = q.dead_letters("a")
    again = [r for r in runs if r[1] > 1]
    q.close()
    assert finished
    assert dead == [], f"{len(dead)} of {ITEMS} dead-lettered: {dead[0].reason}"
    assert again == [], f"{len(again)} runs were a second or later attempt"
    assert sorted(i for i, _ in runs) == sorted(ids)
    bound = config.held_bound()
    assert max(held) <= bound, f"held up to {max(held)} items with a bound of {bound}"


def _left(q: Quick, tenants: list[str]) -> int:
    """Items still stored (not completed nor dead-lettered) in app ``a``'s zones."""
    return sum(q.zones.count(q.zone("a", t)) for t in tenants)


WORKER_APP = textwrap.dedent(
    """
    import os, time
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_TEST_URL"])
    log = os.environ["QUICK_TEST_LOG"]

    @q.job("job")
    def job(payload, ctx):
        with open(log, "a") as f:
            f.write(f"{ctx.item_id} {ctx.attempt}\\n")
        time.sleep(0.3)
    """
)


def test_quick_worker_process_holds_only_what_its_workers_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    (tmp_path / "lease_app.py").write_text(WORKER_APP)
    runlog = tmp_path / "runs.log"
    q = Quick.open(url)
    ids = [q.enqueue("job", {"n": n}, app="a", tenant="t") for n in range(ITEMS // 4)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
        "QUICK_TEST_URL": url,
        "QUICK_TEST_LOG": str(runlog),
    }
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "lease_app:q"]
    proc = subprocess.Popen(
        [*cmd, "--workers", "4", "--lease", str(LEASE_S)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: runlog.exists(), timeout=60), "the worker never started"
        time.sleep(1.0)
        states = [s.state for s in (q.status("a", "t", i) for i in ids) if s is not None]
        leased = states.count("leased")
        # 23 s of handler time on 4 workers, more for the repeats.
        wait_for(lambda: _left(q, ["t"]) == 0, timeout=200)
    finally:
        proc.terminate()
        proc.wait(60)
    dead = q.dead_letters("a")
    lines = runlog.read_text().split()
    attempts = [int(a) for a in lines[1::2]]
    q.close()
    # Four running, and a few more finished but not yet completed by the flusher.
    bound = 4 * 16  # the held bound before issue 40 (now the workers, 4)
    assert leased <= bound, f"a --workers 4 process held {leased} items leased (bound {bound})"
    assert dead == [], f"{len(dead)} of {ITEMS} dead-lettered"
    assert max(attempts) == 1, f"{sum(a > 1 for a in attempts)} ran as attempt 2 or later"


def test_async_consumer_leases_only_what_its_workers_start(tmp_path: Path) -> None:
    """The same rule for ``AsyncQuick``'s consumer: 2 workers, 1 s lease, 0.1 s async
    handlers, 60 items (on the unchanged code all 60 were leased at once)."""
    import asyncio

    from quickzones.aio import AsyncQuick

    async def main() -> tuple[list[int], list[int]]:
        aq = AsyncQuick.open(f"sqlite:///{tmp_path / 'q.db'}")
        attempts: list[int] = []
        held: list[int] = []
        box: list[Any] = []

        @aq.job("job")
        async def job(payload: Any, ctx: JobContext) -> None:
            attempts.append(ctx.attempt)
            held.append(box[0].consumer.in_flight())
            await asyncio.sleep(0.1)

        for n in range(60):
            await aq.enqueue("job", {"n": n}, app="a", tenant="t")
        consumer = aq.consumer(ConsumerConfig(workers=2, item_lease_s=1.0))
        box.append(consumer)
        async with consumer:
            for _ in range(600):
                if len(attempts) >= 60 and _left(aq.quick, ["t"]) == 0:
                    break
                await asyncio.sleep(0.05)
        await aq.aclose()
        return attempts, held

    attempts, held = asyncio.run(main())
    assert sorted(attempts) == [1] * 60, f"{sum(a > 1 for a in attempts)} re-runs"
    bound = ConsumerConfig(workers=2).held_bound()
    assert max(held) <= bound, f"held up to {max(held)} items with 2 workers (bound {bound})"


def test_a_prefetch_keeps_the_leases_of_items_waiting_for_a_worker(
    backend: str, tmp_path: Path
) -> None:
    """A bound above the workers (a prefetch) is safe: an item waiting for a worker longer
    than its lease keeps it (the lease extender renews it), so it is neither leased again
    nor run twice. One worker, 4 held, 1 s lease, 0.6 s handlers: the last waits 1.8 s."""
    if backend == "fdbsim":
        pytest.skip("the FDB backend's code is covered on the real cluster and memory")
    q = Quick.open(store_url(backend, tmp_path))
    runs: list[tuple[str, int]] = []

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        runs.append((ctx.item_id, ctx.attempt))
        time.sleep(0.6)

    ids = [q.enqueue("job", {"n": n}, app="a", tenant="t") for n in range(4)]
    consumer = q.consumer(ConsumerConfig(workers=1, processing_bound=4, item_lease_s=1.0))
    consumer.start()
    try:
        assert wait_for(lambda: _left(q, ["t"]) == 0, timeout=60)
        held_most = consumer.stats["lease_extended"]
    finally:
        consumer.stop()
    q.close()
    assert sorted(runs) == sorted((i, 1) for i in ids), runs
    assert held_most > 0  # the waiting items' leases were renewed

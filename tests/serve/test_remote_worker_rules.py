"""The consumer's rules hold on the remote worker's path too (issue 27 point 1.4): it runs
items through the consumer's one Worker (Algorithm 3) over HTTP, so a cancel reaches a
running handler (``ctx.cancelled``), a run is counted once (``ctx.attempt``, the
status's attempts) and an execution bound interrupts a handler.

On the unchanged code (the remote worker's own copy of the loop): the handler never saw
its cancel (no ``ctx.cancelled`` on that path), and a handler past its execution bound
ran on to its end (it was never interrupted).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from quickzones.errors import Nack
from quickzones.registry import JobContext

from .conftest import Served


def _run(worker: RemoteWorker) -> threading.Thread:
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    return thread


def test_a_remote_handler_sees_its_cancel(served: Served) -> None:
    handlers = Quick.open("memory://")
    started = threading.Event()
    saw: list[bool] = []

    @handlers.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        started.set()
        end = time.monotonic() + 8
        while time.monotonic() < end and not ctx.cancelled:
            time.sleep(0.01)
        saw.append(ctx.cancelled)

    item_id = served.q.enqueue("job", b"", app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        # A 1.5 s lease: it is extended every 0.5 s, which is when a cancel is seen.
        worker = RemoteWorker(handlers.registry, client, workers=1, lease_s=1.5, wait_s=0.2)
        thread = _run(worker)
        try:
            assert started.wait(30)
            served.q.cancel("a", "t", item_id)
            deadline = time.monotonic() + 30
            while not saw and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            worker.request_stop()
            thread.join(30)
            worker.close()
    handlers.close()
    assert saw == [True], "the remote handler never saw its cancel"
    assert worker.stats.completed == 0


def test_remote_attempts_count_runs_and_a_bound_interrupts(served: Served) -> None:
    handlers = Quick.open("memory://")
    attempts: list[int] = []
    ended: list[str] = []

    @handlers.job("nacked")
    def nacked(payload: Any, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise Nack(0.0)

    @handlers.job("slow", execution_bound_s=0.5)
    def slow(payload: Any, ctx: JobContext) -> None:
        try:
            time.sleep(5)
            ended.append("ran to its end")
        except BaseException:
            ended.append("interrupted")
            raise

    item_id = served.q.enqueue("nacked", b"", app="a", tenant="t")
    served.q.enqueue("slow", b"", app="a", tenant="t2")
    with RemoteQuick(served.url, served.a_all) as client:
        worker = RemoteWorker(handlers.registry, client, workers=2, lease_s=3, wait_s=0.2)
        thread = _run(worker)
        try:
            deadline = time.monotonic() + 30
            while (len(attempts) < 2 or not ended) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.request_stop()
            thread.join(30)
            worker.close()
    handlers.close()
    assert attempts == [1, 2]  # the nacked run was the first
    assert ended and set(ended) == {"interrupted"}  # each run, retried after its timeout
    assert served.q.get("a", "t", item_id) is None


def test_a_remote_worker_leases_only_what_its_free_workers_start(served: Served) -> None:
    """2 workers, 1 s lease, 0.1 s handlers, 30 items: each runs once, as attempt 1, and
    the worker never holds more than its 2 workers start."""
    handlers = Quick.open("memory://")
    attempts: list[int] = []
    held: list[int] = []
    box: list[RemoteWorker] = []

    @handlers.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        held.append(box[0].in_flight.total())
        time.sleep(0.1)

    for n in range(30):
        served.q.enqueue("job", n, app="a", tenant=f"t{n % 3}")
    with RemoteQuick(served.url, served.a_all) as client:
        worker = RemoteWorker(handlers.registry, client, workers=2, lease_s=1.0, wait_s=0.2)
        box.append(worker)
        thread = _run(worker)
        try:
            deadline = time.monotonic() + 60
            while worker.stats.completed < 30 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.request_stop()
            thread.join(30)
            worker.close()
    handlers.close()
    assert sorted(attempts) == [1] * 30
    assert max(held) <= 2

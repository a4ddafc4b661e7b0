"""Cancel is on time (issue 27 point 1.6): an item cancelled after a consumer dequeued it
never starts (a Worker checks its item and lease just before it starts it, Algorithm 3)
and is not reported completed; a running handler sees the cancel through ``ctx.cancelled``
within about a second, and the consumer lets the item go.

On the unchanged code: the cancelled item waiting in the local queue ran anyway (1 of 1),
and a handler had no ``ctx.cancelled`` (a cancel reached it only at the next lease
extension, a third of the lease later).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.conftest import store_url
from tests.waiting import wait_for


def test_an_item_cancelled_while_it_waits_for_a_worker_never_starts(
    backend: str, tmp_path: Path
) -> None:
    q = Quick.open(store_url(backend, tmp_path))
    release = threading.Event()
    ran: list[str] = []

    @q.job("block")
    def block(payload: Any, ctx: JobContext) -> None:
        release.wait(30)

    @q.job("job", keep_status_s=3600)
    def job(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    q.enqueue("block", b"", app="a", tenant="t", priority=0)
    victim = q.enqueue("job", b"", app="a", tenant="t", priority=1)
    # One worker, one item of prefetch: the victim waits behind the blocker, leased.
    consumer = q.consumer(ConsumerConfig(workers=1, processing_bound=2, in_order=True))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.in_flight() == 2, 30)
        q.cancel("a", "t", victim)
        release.set()
        assert wait_for(lambda: consumer.in_flight() == 0, 30)
        consumer.flush_completions()
    finally:
        consumer.stop()
    status = q.status("a", "t", victim)
    completed = consumer.stats["completed"]
    q.close()
    assert ran == [], "a cancelled item started"
    assert status is not None and status.state == "cancelled"
    assert completed == 1  # the blocker only


def _cancelled_while_running(
    backend: str, tmp_path: Path, body: Callable[[JobContext], None]
) -> tuple[float, int]:
    """Run one item whose handler runs ``body(ctx)`` once started, cancel it while it
    runs, and let the consumer let it go; returns when the cancel was made (monotonic)
    and the consumer's completed count, having checked the item is recorded cancelled
    and gone."""
    q = Quick.open(store_url(backend, tmp_path))
    started = threading.Event()

    @q.job("job", keep_status_s=3600)
    def job(payload: Any, ctx: JobContext) -> None:
        started.set()
        body(ctx)

    item_id = q.enqueue("job", b"", app="a", tenant="t")
    consumer = q.consumer(ConsumerConfig(workers=1))
    consumer.start()
    try:
        assert started.wait(30)
        cancelled_at = time.monotonic()
        q.cancel("a", "t", item_id)
        assert wait_for(lambda: consumer.in_flight() == 0, 30)  # its worker is free
        consumer.flush_completions()
    finally:
        consumer.stop()
    status = q.status("a", "t", item_id)
    assert status is not None and status.state == "cancelled"
    assert q.get("a", "t", item_id) is None
    q.close()
    return cancelled_at, consumer.stats["completed"]


def test_a_running_handler_sees_its_cancel(backend: str, tmp_path: Path) -> None:
    saw: list[float] = []

    def poll(ctx: JobContext) -> None:
        end = time.monotonic() + 8  # under the 10 s to the lease's first extension
        while time.monotonic() < end:
            if ctx.cancelled:
                saw.append(time.monotonic())
                return
            time.sleep(0.01)

    cancelled_at, completed = _cancelled_while_running(backend, tmp_path, poll)
    assert saw, "the handler never saw its cancel"
    print(f"seen {saw[0] - cancelled_at:.2f}s after the cancel")
    assert completed == 0


def test_a_handler_waiting_on_its_cancel_event_wakes_when_cancelled(
    backend: str, tmp_path: Path
) -> None:
    """``ctx.cancel_event`` is waited on, not polled: the cancel wakes the wait (the event
    is made only when a handler waits, issue 29 point 3; it must still be woken)."""
    woke: list[bool] = []

    def wait(ctx: JobContext) -> None:
        woke.append(ctx.cancel_event.wait(8))  # under the 10 s to the first extension

    _, completed = _cancelled_while_running(backend, tmp_path, wait)
    assert woke == [True], "the handler's wait was not woken by its cancel"
    assert completed == 0

"""``consumer.request_stop()`` from another thread ends ``run_forever()`` (issue 41 point
15). Before, it only stopped the consumer's threads from taking work: ``run_forever`` kept
waiting for a signal or ``stop()``, still running 15 s later."""

from __future__ import annotations

import threading
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.waiting import wait_for


def test_request_stop_from_another_thread_ends_run_forever() -> None:
    q = Quick.open("memory://")
    ran: list[str] = []

    @q.job("j")
    def j(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    consumer = q.consumer(ConsumerConfig(shutdown_deadline_s=5.0))
    runs = threading.Thread(
        target=lambda: consumer.run_forever(install_signals=False), daemon=True
    )
    runs.start()
    try:
        first = q.enqueue("j", b"", app="a", tenant="t")
        assert wait_for(lambda: first in ran, 30)  # running
        consumer.request_stop()  # returns at once, from this (another) thread
        assert wait_for(lambda: not runs.is_alive(), 15), "run_forever still running"
        # Stopped: nothing new is taken.
        later = q.enqueue("j", b"", app="a", tenant="t")
        item = q.get("a", "t", later)
        assert later not in ran and item is not None and item.attempts == 0
    finally:
        if runs.is_alive():
            consumer.stop()
        q.close()

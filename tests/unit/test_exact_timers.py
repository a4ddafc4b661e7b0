"""Issue 15 point 5: exact timers. An idle consumer sleeps until the earliest vesting time
it saw (at most ``idle_sleep_s``), and a local enqueue wakes it; idle, it polls no more
than before. Lateness itself is measured by bench/delayed_lateness.py, not asserted."""

from __future__ import annotations

import threading
import time
from typing import Any

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.waiting import wait_for


def recorder(q: Quick) -> list[tuple[str, float]]:
    """Handler 'timed' records (item id, ms after its vesting time it started)."""
    started: list[tuple[str, float]] = []

    def timed(payload: Any, ctx: JobContext) -> None:
        started.append((ctx.item_id, time.time() * 1000 - ctx.item.enqueued_ms - payload))

    q.job("timed")(timed)
    return started


def test_peek_tells_the_earliest_vesting_time_not_yet_vested(q: Quick, clock: ManualClock) -> None:
    q.enqueue("j", b"", app="a", tenant="later", delay=5)
    q.enqueue("j", b"", app="a", tenant="latest", delay=9)
    now = int(clock.now() * 1000)
    assert q.toplevel.peek(0, 10) == ([], now + 5000)
    q.enqueue("j", b"", app="a", tenant="now")
    refs, later = q.toplevel.peek(0, 10)
    assert len(refs) == 1 and later == now + 5000
    assert q.toplevel.peek(0, 1) == (refs, now + 5000)
    clock.advance(10)
    refs, later = q.toplevel.peek(0, 10)
    assert len(refs) == 3 and later is None


def test_a_scan_remembers_the_next_vesting_time(q: Quick, clock: ManualClock) -> None:
    consumer = q.consumer(ConsumerConfig(in_order=False))
    assert consumer.scan_once() == [] and consumer.scanner.next_vesting_ms is None
    q.enqueue("j", b"", app="a", tenant="t", delay=2)
    assert consumer.scan_once() == []
    assert consumer.scanner.next_vesting_ms == int(clock.now() * 1000) + 2000


def test_delayed_item_starts_on_its_timer_not_early_and_not_by_polling(real_q: Quick) -> None:
    started = recorder(real_q)
    # The idle poll is far longer than the test: only the timer can start the items.
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60, workers=2))
    consumer.start()
    try:
        ids = [
            real_q.enqueue("timed", ms, app="a", tenant=f"t{ms}", delay=ms / 1000)
            for ms in (300, 600, 900)
        ]
        assert wait_for(lambda: len(started) == 3)
        scans = consumer.stats["scan"]
    finally:
        consumer.stop(5)
    assert sorted(i for i, _ in started) == sorted(ids)
    assert all(late >= 0 for _, late in started), started  # none started early
    # A scan per enqueue wake-up, per timer and per visit's follow-up: no polling.
    assert scans <= 20, scans


def test_local_enqueue_wakes_an_idle_consumer(real_q: Quick) -> None:
    ran = threading.Event()
    real_q.job("j")(lambda payload, ctx: ran.set())
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        time.sleep(0.3)  # idle: no scan while it sleeps
        idle_scans = consumer.stats["scan"]
        real_q.enqueue("j", b"", app="a", tenant="t")
        assert ran.wait(20)  # long before the 60 s poll
    finally:
        consumer.stop(5)
    assert idle_scans <= 2, idle_scans


def test_idle_consumer_polls_no_more_than_its_idle_sleep(real_q: Quick) -> None:
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=0.1))
    consumer.start()
    began = time.monotonic()
    try:
        time.sleep(0.5)
    finally:
        consumer.stop(5)
    elapsed = time.monotonic() - began
    assert consumer.stats["scan"] <= elapsed / 0.1 + 2


def test_enqueue_in_a_transaction_wakes_after_the_commit(real_q: Quick) -> None:
    ran = threading.Event()
    real_q.job("j")(lambda payload, ctx: ran.set())
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        real_q.transact(lambda tr: real_q.enqueue("j", b"", app="a", tenant="t", tr=tr))
        assert ran.wait(20)
    finally:
        consumer.stop(5)

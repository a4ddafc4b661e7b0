"""A tenant at its concurrency cap runs at its cap (issue 31 point 2): when one of its
running items ends on the consumer that held its zone back for the cap, the zone is
looked at again at once, not ``RECHECK_MS`` later (which ran 2 items per 250 ms, 8 a
second, while the slots freed every 10 ms)."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.cap_wake import CapWake
from quickzones.consumer.tenant_admission import RECHECK_MS
from quickzones.store.records import ZoneId
from quickzones.store.toplevel import TopLevelQueue
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for


def _stalls(spans: list[tuple[float, float]], cap: int, gap_s: float) -> int:
    """How often a slot stayed free longer than ``gap_s`` while items were left: the
    k-th start after the first ``cap`` waits for the (k - cap)-th end."""
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    return sum(1 for k in range(cap, len(starts)) if starts[k] - ends[k - cap] > gap_s)


def test_a_tenant_capped_at_2_runs_at_2_not_at_the_recheck_pace(live_q: Quick) -> None:
    """200 items of 10 ms, max_running=2, one consumer of 4 workers: never 3 at once,
    and a freed slot is taken again without a ``RECHECK_MS`` stall (unchanged code: 99 of
    198 starts waited more than RECHECK_MS / 2 behind a free slot on memory, 99 on
    sqlite; the drain took 25 s against 1 s of work a slot). Another tenant's 50 items
    all ran; every item ran once."""
    q = live_q
    spans: dict[str, list[tuple[float, float]]] = {"noisy": [], "quiet": []}
    lock = threading.Lock()

    def handler(payload: Any, ctx: Any) -> None:
        start = time.monotonic()
        time.sleep(0.01)
        with lock:
            spans[ctx.tenant].append((start, time.monotonic()))

    q.job("j", keep_status_s=600)(handler)
    q.set_tenant_limit("a", "noisy", max_running=2)
    noisy = q.enqueue_many("j", list(range(200)), app="a", tenant="noisy")
    quiet = q.enqueue_many("j", list(range(50)), app="a", tenant="quiet")
    consumer = q.consumer(ConsumerConfig(workers=4, idle_sleep_s=0.01))
    began = time.monotonic()
    consumer.start()
    try:
        assert wait_for(lambda: len(spans["noisy"]) >= 200 and len(spans["quiet"]) >= 50, 120)
        drained_s = time.monotonic() - began
        time.sleep(0.1)  # nothing more starts
    finally:
        consumer.stop()
    assert len(spans["noisy"]) == 200 and len(spans["quiet"]) == 50
    assert most_at_once(spans["noisy"]) <= 2
    stalls = _stalls(spans["noisy"], 2, RECHECK_MS / 2000)
    # The recheck pace stalls every other start (99 of 198); a loaded 2-core host stalls
    # some starts on its own (the old bound of 10 failed on FoundationDB beside a full test
    # run), so the bound sits well between the two.
    assert stalls <= 40, (stalls, drained_s)
    for tenant, ids in (("noisy", noisy), ("quiet", quiet)):
        assert all(q.status("a", tenant, i).attempts == 1 for i in ids)  # type: ignore[union-attr]


class _Pulls:
    """A top-level queue's part two, recorded (CapWake needs no other operation)."""

    def __init__(self) -> None:
        self.pulled: list[tuple[ZoneId, int]] = []

    def pull_pointer_earlier(self, zone: ZoneId, vesting_ms: int) -> None:
        self.pulled.append((zone, vesting_ms))


def test_an_end_between_the_cap_count_and_the_requeue_still_wakes_the_zone() -> None:
    """The item ends after the visit counted the full cap and before its pointer's
    requeue committed: the zone is woken as soon as it is requeued, not RECHECK_MS on.
    An end with nothing waiting wakes nothing; an app slot's end is not a tenant's."""
    clock = ManualClock(1_000.0)
    woken: list[int] = []
    wake = CapWake(clock, lambda: woken.append(1))
    top, zone, name = _Pulls(), ZoneId("a", "t"), ("a", "t")
    queue = cast(TopLevelQueue, top)
    wake.ended("tenant", name)  # nothing waits: nothing pulled
    seen = wake.seen(name)
    wake.ended("tenant", name)  # between the count and the requeue
    wake.wait(name, seen, queue, zone)
    assert top.pulled == [(zone, 1_000_000)] and woken == [1]
    wake.wait(name, wake.seen(name), queue, zone)  # waits now
    wake.ended("app", "a")
    assert len(top.pulled) == 1
    wake.ended("tenant", name)
    assert top.pulled[-1] == (zone, 1_000_000) and len(top.pulled) == 2
    wake.ended("tenant", name)  # woken once per wait
    assert len(top.pulled) == 2

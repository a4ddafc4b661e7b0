"""Issue 41 point 11: a tenant's start rate delivers the rate it names. 10/s gave 8.6-9.0/s
with one consumer: each visit's lateness was lost (the next start was spaced from the late
visit, not from the slot it filled), and a start cost about 3 visits (the consumer's timer
look-ahead leased the limited zone's pointer before its slot, found nothing allowed yet
and requeued it, twice). The schedule now runs from slot to slot, and the zone's pointer
comes back when its look-ahead scan reaches the next slot."""

from __future__ import annotations

import math
import threading
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.store.limits import start_slots
from tests.waiting import wait_for

# A second less the dequeue's varying delay after its grant (see the test's docstring).
OBSERVED_SECOND_MS = 900


def test_a_late_visit_keeps_the_schedule(q: Quick, clock: ManualClock) -> None:
    """10/s is a start each 100 ms from the last slot: a visit 30 ms late starts its item,
    and the next start is due 100 ms after the slot it filled, not after the late visit
    (before: at 0.23 s, so nothing started at 0.2 s)."""
    ran: list[int] = []
    q.job("j")(lambda payload, ctx: ran.append(payload))
    q.set_tenant_limit("a", "t", rate=10, per=1.0)
    q.enqueue_many("j", list(range(10)), app="a", tenant="t")
    q.run_until_idle()
    assert len(ran) == 1  # the burst of an idle tenant: a tenth of its rate, at least 1
    clock.advance(0.13)  # the visit for the 0.1 s slot comes 30 ms late
    q.run_until_idle()
    assert len(ran) == 2
    clock.advance(0.07)  # 0.2 s: the next slot of the schedule
    q.run_until_idle()
    assert len(ran) == 3, "the late visit's 30 ms were lost"
    clock.advance(0.1)
    q.run_until_idle()
    assert len(ran) == 4
    # Time away is no lateness: after a long pause the burst (1) starts, not a catch-up.
    clock.advance(5)
    q.run_until_idle()
    assert len(ran) == 5


def test_a_rate_of_10_a_second_delivers_10_a_second(live_q: Quick) -> None:
    """66 items of one tenant at 10/s through one consumer: over the steady period (after
    the first start) the rate is within 5 % of 10/s (before: 8.5/s), no second holds more
    than the burst allowance (10 + 1), and each start costs about one visit of the zone
    (before: 3.3).

    The schedule bounds the starts it *grants*; the test sees each when its visit's
    dequeue has committed, some milliseconds later and by a varying amount. A visit late
    by almost an interval keeps its slot (``LATE_CARRY_MS``), so 11 grants can span
    almost exactly one second, and a few milliseconds of commit jitter on a loaded host
    put a twelfth into a second as observed (CI, fdb: 12). The windows counted here are
    0.9 s: a twelfth start in one needs the dequeue's delay to vary by 100 ms."""
    q = live_q
    n = 66
    dequeued: list[int] = []
    visits = 0
    lock = threading.Lock()

    def observe(event: str, fields: dict[str, Any]) -> None:
        nonlocal visits
        zone = fields.get("zone")
        if zone is None or zone.tenant != "slow":
            return
        with lock:
            if event == "dequeued":  # when the visit took it: the start it was granted
                dequeued.append(now_ms(q.clock))
            elif event == "visited":
                visits += 1

    q.job("j")(lambda payload, ctx: None)
    q.set_tenant_limit("a", "slow", rate=10, per=1.0)
    q.enqueue_many("j", list(range(n)), app="a", tenant="slow")
    consumer = q.consumer(ConsumerConfig(workers=4), observer=observe)
    consumer.start()
    try:
        assert wait_for(lambda: len(dequeued) >= n, 30)
    finally:
        consumer.stop()
    starts = sorted(dequeued)
    steady = starts[1:]  # the first start is the idle tenant's burst
    rate = (len(steady) - 1) / ((steady[-1] - steady[0]) / 1000)
    most = max(sum(1 for s in starts if at <= s < at + OBSERVED_SECOND_MS) for at in starts)
    assert 9.5 <= rate <= 10.5, f"{rate:.2f} starts/s"
    assert most <= 11, f"{most} starts in one second"
    assert visits <= 1.5 * n, f"{visits / n:.2f} visits a start"


@settings(max_examples=300, deadline=None)
# A visit late by 1.9 intervals, then visits often: the lateness a schedule may keep is
# under one interval, or the late visit takes two starts and a second holds rate + 2.
@example(rate=10, per_ms=1000, gaps=[0, 290] + [10] * 150, wanted=4)
@given(
    rate=st.integers(1, 50),
    per_ms=st.sampled_from([1000, 60_000]),
    gaps=st.lists(st.integers(0, 250) | st.just(5_000), min_size=1, max_size=200),
    wanted=st.integers(1, 8),
)
def test_granted_starts_keep_the_stated_bound(
    rate: int, per_ms: int, gaps: list[int], wanted: int
) -> None:
    """Whatever the visits' timing (late, early, bunched, idle spells), the starts the
    schedule grants keep what ``Limits.grant_starts`` states: in any window of T ms at
    most ceil(rate x T / per_ms) + burst, here for T = per_ms."""
    stored: float | None = None
    now = 1_000_000
    granted_at: list[int] = []
    for gap in gaps:
        now += gap * per_ms // rate // 100  # a gap in hundredths of the interval
        granted, t, _ = start_slots(stored, now, wanted, rate, per_ms)
        if granted:
            stored = t
        granted_at += [now] * granted
    burst = max(1, math.ceil(rate / 10))
    most = max(
        (sum(1 for s in granted_at if at <= s < at + per_ms) for at in granted_at), default=0
    )
    assert most <= rate + burst

"""A visit tells the scanner when its zone's pointer vests next (issue 40 point 9, issue 44
points 2 and 5: CPU an item). A consumer serving tenants that enqueue now and then visits
each zone as its item arrives, and the visit empties it: its pointer is requeued to vest
later (its leased items' lease, or ``min_inactive_s``) or collected. The scanner then
peeked the top-level queue again at once, and found nothing: two peeks an item, half of
them empty (``quick demo``: 7,700 of its 14,000 scans, some 5 % of its CPU). A zone whose
visit left it vesting later is not peeked again before then: the scanner waits, as after
a scan that found nothing, for a local enqueue, another process's commit, or the earliest
vesting time it knows, which now includes the requeued zones'."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url
from tests.other_process import enqueue_from_another_process
from tests.waiting import wait_for

# The stores another process can commit to, whose commits the scanner's wait watches. The
# in-memory store has no such watcher (a second Quick on it does not wake this one's
# consumer): its scanner peeks after each visit as before, and polls.
WATCHED = [
    "sqlite",
    *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else []),
    *(["postgres"] if HAVE_POSTGRES else []),
]
# Of those, the ones whose watchers leave out this process's own commits. FoundationDB's
# watch of the wake key sees this process's own enqueue's bump a moment after the enqueue
# woke the scanner, so its wait after the visit ends at once and it peeks, as before.
OWN_COMMITS_UNSEEN = ["sqlite", *(["postgres"] if HAVE_POSTGRES else [])]


@pytest.mark.parametrize("backend", OWN_COMMITS_UNSEEN)
def test_a_visit_that_empties_its_zone_is_not_followed_by_an_empty_scan(
    backend: str, tmp_path: Path
) -> None:
    real_q = Quick.open(store_url(backend, tmp_path))
    ran: list[str] = []
    real_q.job("j")(lambda payload, ctx: ran.append(ctx.item_id))
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        time.sleep(0.1)
        before = consumer.stats["scan"]
        for n in range(20):
            real_q.enqueue("j", b"", app="a", tenant=f"t{n}")
            assert wait_for(lambda n=n: len(ran) == n + 1)
            time.sleep(0.02)  # the visit's requeue commits after its items are handed out
        scans = consumer.stats["scan"] - before
        visits = consumer.stats["visited"]
    finally:
        consumer.stop(5)
        real_q.close()
    assert visits == 20
    # A scan for each enqueue's wake-up; none after the visit that emptied the zone
    # (40 before: a second, empty, peek an item).
    assert scans <= 24, scans


def test_an_item_left_in_a_visited_zone_starts_at_its_vesting_time(real_q: Quick) -> None:
    """The visit of the zone's first item requeues its pointer at the second's vesting
    time, which no scan has seen: the scanner must wake then, not at its idle poll."""
    started: dict[str, float] = {}
    real_q.job("j")(lambda payload, ctx: started.setdefault(payload, time.monotonic()))
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        at = time.monotonic()
        real_q.enqueue("j", "later", app="a", tenant="t", delay=0.4)
        real_q.enqueue("j", "now", app="a", tenant="t")
        assert wait_for(lambda: "later" in started, timeout=10)
    finally:
        consumer.stop(5)
    assert started["now"] - at < 1
    late = started["later"] - at - 0.4
    assert -0.01 <= late < 1.0, late  # never early; far from the 60 s idle poll


@pytest.mark.parametrize("backend", WATCHED)
def test_another_process_enqueue_after_a_visit_is_picked_up_at_once(
    backend: str, tmp_path: Path
) -> None:
    """The wait that follows a visit (no peek after it) watches the commits since the scan
    before the visit: another process's enqueue wakes it, not the safety poll (1.7 s)."""
    url = store_url(backend, tmp_path)
    q = Quick.open(url)
    started: dict[str, float] = {}
    q.job("job")(lambda payload, ctx: started.setdefault(ctx.tenant, time.monotonic()))
    consumer = q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        for n in range(3):
            q.enqueue("job", b"", app="a", tenant=f"here{n}")
            assert wait_for(lambda n=n: f"here{n}" in started)
            enqueue_from_another_process(url, f"there{n}")
            committed = time.monotonic()
            assert wait_for(lambda n=n: f"there{n}" in started, timeout=10)
            assert started[f"there{n}"] - committed < 1.0
    finally:
        consumer.stop(5)
        q.close()

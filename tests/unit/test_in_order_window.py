"""The in-order scanner's window (issue 27 point 5, review): how many pointers a shard the
consumer holding the scanner election peeks is the module constant
``quickzones.consumer.selection.IN_ORDER_PEEK_MAX``, not a ``ConsumerConfig`` field. From the
user's side: the in-order consumer still takes the oldest vested zones first, counts the
competing zones it can see for the work-conserving share, and knows when there are more
than it could see (share 0: visits stay at ``dequeue_max``); ``peek_max`` still caps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.selection import IN_ORDER_PEEK_MAX
from tests.waiting import wait_for


def _zones(tenants: int) -> tuple[Quick, list[int]]:
    """One shard, one item in each of ``tenants`` zones, each vested 1 ms after the last;
    the zones' vesting times, oldest first."""
    clock = ManualClock()
    q = Quick.open("memory://", clock=clock, shards=1)
    q.job("j")(lambda payload, ctx: None)
    vesting = []
    for t in range(tenants):
        vesting.append(now_ms(clock))
        q.enqueue("j", b"", app="a", tenant=f"t{t:04d}")
        clock.advance(0.001)
    return q, vesting


# Room for selection_max items (16 workers): a scan may choose selection_max zones.
ROOMY = ConsumerConfig(in_order=True, workers=16)


def test_in_order_scanner_takes_the_oldest_and_counts_the_zones_it_sees() -> None:
    q, vesting = _zones(50)
    consumer = q.consumer(ROOMY)
    refs = consumer.scan_once()
    assert [ref.vesting_ms for ref in refs] == vesting[: ConsumerConfig().selection_max]
    # All 50 seen: the free room (16 workers) is shared over them.
    assert consumer.scanner.share == consumer.config.held_bound() // 50
    q.close()


def test_more_zones_than_the_window_leave_the_share_unknown() -> None:
    q, vesting = _zones(IN_ORDER_PEEK_MAX + 20)
    consumer = q.consumer(ROOMY)
    refs = consumer.scan_once()
    assert [ref.vesting_ms for ref in refs] == vesting[: ConsumerConfig().selection_max]
    assert consumer.scanner.share == 0  # could not see them all: visits of dequeue_max
    q.close()


def test_peek_max_caps_the_in_order_window() -> None:
    q, _ = _zones(30)
    consumer = q.consumer(ConsumerConfig(in_order=True, peek_max=20))
    consumer.scan_once()
    assert consumer.scanner.share == 0
    q.close()


def test_in_order_peek_max_is_no_longer_a_setting() -> None:
    with pytest.raises(TypeError, match="in_order_peek_max"):
        ConsumerConfig(in_order_peek_max=100)  # type: ignore[call-arg]


def test_the_share_is_counted_exactly_where_it_sizes_visits() -> None:
    """The first window is short (twice selection_max), but long enough to count the
    zones wherever the share exceeds dequeue_max: 400 workers over 30 zones take 13 each."""
    q, _ = _zones(30)
    consumer = q.consumer(ConsumerConfig(in_order=True, workers=400, dequeue_max=10))
    consumer.scan_once()
    assert consumer.scanner.share == 400 // 30
    q.close()


def test_zones_set_aside_at_the_head_do_not_hide_the_oldest_others() -> None:
    """The oldest 40 vested zones are set aside after failed visits: more than the first,
    short window. The scan reads the wider one and still takes the oldest of the others
    (invariant 10), not nothing."""
    q, vesting = _zones(60)
    consumer = q.consumer(ROOMY)
    for ref in q.toplevel.peek_pointers(0, 40):
        consumer.scanner.set_aside.failed((ref.cluster, ref.shard, ref.pointer_id), OSError("bad"))
    refs = consumer.scan_once()
    assert [ref.vesting_ms for ref in refs] == vesting[40 : 40 + ConsumerConfig().selection_max]
    q.close()


def test_a_scan_chooses_no_more_zones_than_the_consumer_has_room_for() -> None:
    """Issue 43 case 3: 4 free workers and 50 one-item zones. The scan peeked 32 pointers
    and chose 16 zones, and handed 12 of them to visits that could lease nothing
    (Algorithm 1 line 5 allows 4 items). It peeks 8 and chooses the oldest 4 now, says
    vested zones are left, and the drain still takes every zone."""
    q, vesting = _zones(50)
    consumer = q.consumer(ConsumerConfig(in_order=True, workers=4))
    windows: list[int] = []
    peek = consumer.scanner.peek

    def counting(cluster, shard, window, horizon_ms):  # type: ignore[no-untyped-def]
        windows.append(window)
        return peek(cluster, shard, window, horizon_ms)

    consumer.scanner.peek = counting
    refs = consumer.scan_once()
    assert [ref.vesting_ms for ref in refs] == vesting[:4]
    assert windows == [8]
    assert consumer.scanner.left_vested  # more vested zones than it chose: scan again
    assert consumer.scanner.share == 0  # more zones than room: visits of dequeue_max
    assert consumer.run_until_idle() == 50
    q.close()


def test_a_short_window_of_zones_it_holds_items_of_reads_the_full_one() -> None:
    """The short window is read alone only when it holds as many zones the consumer holds
    nothing of as it has room for: a slot freed while the oldest zones' items are held
    still goes to the oldest zone holding none further on (fewest held first)."""
    q, vesting = _zones(40)
    consumer = q.consumer(ConsumerConfig(in_order=True, workers=4))
    oldest = {ref.pointer_id for ref in q.toplevel.peek_pointers(0, 10)}
    consumer.scanner.held = lambda ref: 1 if ref.pointer_id in oldest else 0
    refs = consumer.scan_once()
    assert [ref.vesting_ms for ref in refs] == vesting[10:14]
    q.close()


def test_a_running_consumer_chooses_about_one_zone_per_item_it_can_take(
    tmp_path: Path,
) -> None:
    """The threaded consumer, as ``quick worker --workers 4`` runs it, over 200 one-item
    zones: each scan chose 16 zones for the room of 4 free workers, and scanned again
    while its visits had not yet taken that room, so about four zones were chosen (and
    visits run) for every item a visit could lease. Now a scan chooses for the room its
    running visits leave, and the zones chosen stay near the items."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        q.job("j")(lambda payload, ctx: None)
        for t in range(200):
            q.enqueue("j", b"", app="a", tenant=f"t{t:04d}")
        chosen: list[int] = []

        def observe(event: str, fields: dict[str, Any]) -> None:
            if event == "scan":
                chosen.append(fields["pointers"])

        consumer = q.consumer(ConsumerConfig(workers=4), observer=observe)
        consumer.start()
        try:
            assert wait_for(lambda: consumer.stats["completed"] == 200)
        finally:
            consumer.stop()
        assert sum(chosen) <= 300, f"{sum(chosen)} zones chosen for 200 items"
    finally:
        q.close()

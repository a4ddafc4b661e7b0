"""Batches take turns (adapters/http/bulk.py, issue 41 point 5): at most ``items_at_once``
items are written at a time, first come first served, and a batch that gets no turn
within ``wait_s`` is told so (the route answers 503 busy with Retry-After)."""

from __future__ import annotations

import threading

from quickzones.adapters.http.bulk import BatchTurns
from tests.waiting import wait_for


def test_a_batch_waits_for_room_and_gives_up_after_wait_s() -> None:
    turns = BatchTurns(items_at_once=10, wait_s=0.2)
    with turns.turn(10) as first:
        assert first
        with turns.turn(1) as second:
            assert not second  # no room within 0.2 s: nothing may be written
    with turns.turn(6) as a, turns.turn(4) as b:
        assert a and b  # 6 + 4 fit at once


def test_turns_are_first_come_first_served() -> None:
    turns = BatchTurns(items_at_once=10, wait_s=30)
    order: list[str] = []
    release = threading.Event()

    def batch(name: str, n: int) -> None:
        with turns.turn(n) as admitted:
            assert admitted
            order.append(name)
            release.wait(30)

    holder = threading.Thread(target=batch, args=("holder", 10))
    holder.start()
    assert wait_for(lambda: order == ["holder"], timeout=10)
    big = threading.Thread(target=batch, args=("big", 10))
    big.start()
    assert wait_for(lambda: len(turns._line) == 1, timeout=10)
    small = threading.Thread(target=batch, args=("small", 1))
    small.start()
    assert wait_for(lambda: len(turns._line) == 2, timeout=10)
    release.set()
    for t in (holder, big, small):
        t.join(30)
    # The small batch, though it would have fit beside the holder's end sooner, did not
    # overtake the big one that came first.
    assert order == ["holder", "big", "small"]

"""Algorithm 3's check before an item starts: what it costs and what it must still catch.

``run_until_idle`` (and ``Quick.run_until_idle``) dequeued a round of items and then read
each again in its own transaction just before its handler started, though it had leased
it a moment before with a long lease: a tenth of a drain's CPU (bench.demo_cpu, issue 44
point 5). Its dequeue is its check now, as for an item a threaded consumer hands to an
idle worker, within ``START_CHECK_AFTER_S`` of it; what that check is for is still done:
a cancel through this process stops the item, and an item whose lease ran low (it may
have lapsed on another consumer's clock) is read before it starts, so none starts while
another consumer may hold it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.records import WorkItem, ZoneId
from tests.conftest import store_url

CFG = ConsumerConfig(in_order=True, item_lease_s=30.0)


class CountingStarts:
    """A zone store that counts the start checks (``start``) made through it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.starts = 0

    def start(self, zone: ZoneId, item_id: str, lease_id: str) -> WorkItem:
        self.starts += 1
        return self.inner.start(zone, item_id, lease_id)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _open(backend: str, tmp_path: Path, clock: Any) -> tuple[Quick, CountingStarts]:
    made: list[CountingStarts] = []

    def counting(q: Quick) -> Any:
        made.append(CountingStarts(q.zones))
        return made[0]

    q = Quick.open(store_url(backend, tmp_path), clock=clock, zone_store=counting)
    return q, made[0]


def test_run_until_idle_starts_what_it_just_dequeued_without_reading_it_again(
    backend: str, tmp_path: Path, clock: Any
) -> None:
    q, store = _open(backend, tmp_path, clock)
    try:
        ran: list[int] = []
        q.job("j")(lambda payload, ctx: ran.append(payload))
        for n in range(12):
            q.enqueue("j", n, app="a", tenant=f"t{n % 3}")
        assert q.consumer(CFG).run_until_idle() == 12
        assert sorted(ran) == list(range(12))
        assert store.starts == 0
        assert q.zones.count(ZoneId("a", "t0")) == 0
    finally:
        q.close()


def test_a_cancel_through_this_process_still_stops_an_item_of_the_round(
    backend: str, tmp_path: Path, clock: Any
) -> None:
    q, _ = _open(backend, tmp_path, clock)
    try:
        ran: list[int] = []
        ids: dict[int, str] = {}

        def handler(payload: int, ctx: Any) -> None:
            ran.append(payload)
            if len(ran) == 1:
                q.cancel("a", "t", ids[1 - payload])  # the round's other item, held here

        q.job("j")(handler)
        for n in range(2):
            ids[n] = q.enqueue("j", n, app="a", tenant="t")
        events: list[str] = []
        consumer = q.consumer(CFG, observer=lambda e, f: events.append(e))
        consumer.run_until_idle()
        assert len(ran) == 1 and "cancelled" in events
    finally:
        q.close()


def test_an_item_whose_lease_ran_low_is_read_before_it_starts_and_never_runs_twice(
    backend: str, tmp_path: Path, clock: Any
) -> None:
    """The round's second item lapses while the first runs (the clock passes its lease)
    and another consumer leases it: this consumer reads it and does not start it."""
    q, store = _open(backend, tmp_path, clock)
    try:
        ran: list[int] = []
        ids: dict[int, str] = {}
        zone = ZoneId("a", "t")

        def handler(payload: int, ctx: Any) -> None:
            ran.append(payload)
            if len(ran) == 1:
                clock.advance(CFG.item_lease_s + 1)  # the other's lease lapses...
                q.zones.obtain_lease(zone, ids[1 - payload], 60_000)  # ...another takes it

        q.job("j")(handler)
        for n in range(2):
            ids[n] = q.enqueue("j", n, app="a", tenant="t")
        events: list[str] = []
        q.consumer(CFG, observer=lambda e, f: events.append(e)).run_until_idle()
        assert len(ran) == 1 and "lease_lost" in events and store.starts == 1
        assert q.zones.get(zone, ids[1 - ran[0]]) is not None  # the other holder's to run
    finally:
        q.close()

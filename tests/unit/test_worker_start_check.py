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


class CountingElection:
    """An election (``Quick.consumer(election=...)``) that counts the calls it answers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def try_acquire(self, name: str, holder: str, ttl: float) -> Any:
        self.calls += 1
        return self.inner.try_acquire(name, holder, ttl)

    def renew(self, lease: Any, ttl: float) -> Any:
        self.calls += 1
        return self.inner.renew(lease, ttl)

    def release(self, lease: Any) -> bool:
        return bool(self.inner.release(lease))

    def close(self) -> None:
        self.inner.close()


def test_run_until_idle_renews_its_scanner_lease_as_the_threaded_scanner_does(
    q: Quick, clock: Any
) -> None:
    """Not once per round (a store transaction each, 5 % of bench.demo_cpu's drain): at
    most every ``election_ttl_s / 3``, and at once when the lease is not held."""
    from quickzones.consumer.election import LocalElection

    q.job("j")(lambda payload, ctx: None)
    for n in range(40):
        q.enqueue("j", n, app="a", tenant="t")
    election = CountingElection(LocalElection(clock))
    consumer = q.consumer(ConsumerConfig(workers=2), election=election)
    assert consumer.run_until_idle() == 40
    assert consumer.stats["visited"] >= 20 and election.calls == 1
    assert consumer.in_order
    # A lease that lapsed meanwhile (the clock passed its TTL) is taken again first.
    clock.advance(ConsumerConfig().election_ttl_s * 2)
    q.enqueue("j", 40, app="a", tenant="t")
    assert consumer.run_until_idle() == 1 and consumer.in_order

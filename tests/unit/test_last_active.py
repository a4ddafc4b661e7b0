"""A pointer's "last active" is the last time a visit or an enqueue saw items in its zone,
as the paper defines it for pointer collection: a zone is collected only after it was
empty and inactive for ``min_inactive`` (issue 27, point 1.7)."""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig

CONFIG = ConsumerConfig(in_order=True, min_inactive_s=10, pointer_lease_s=1)


def test_a_zone_seen_with_an_item_in_flight_is_not_collected_at_once(
    q: Quick, clock: ManualClock
) -> None:
    q.job("job")(lambda payload, ctx: None)
    start_ms = int(clock.now() * 1000)
    item_id = q.enqueue("job", b"", app="app", tenant="busy")
    zone = q.zone("app", "busy")
    clock.advance(20)  # the pointer was made 20 s ago
    # Another worker holds the item, with a 3 s lease, while this consumer visits.
    [leased] = q.zones.dequeue(zone, 1, 3_000)[0]
    consumer = q.consumer(CONFIG)
    consumer.run_until_idle()
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None
    assert pointer.last_active_ms == start_ms + 20_000  # the visit saw the leased item
    q.zones.complete(zone, item_id, leased.lease_id)
    clock.advance(3)  # the lease's end: the pointer vests, the zone is empty
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(zone) is not None, "collected 3 s after it held an item"
    clock.advance(10)
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(zone) is None  # empty and inactive for 10 s: collected


def test_a_zone_with_items_is_never_collected(q: Quick, clock: ManualClock) -> None:
    q.job("job")(lambda payload, ctx: None)
    q.enqueue("job", b"", app="app", tenant="later", delay=3 * 3600)
    zone = q.zone("app", "later")
    consumer = q.consumer(CONFIG)
    for _ in range(3 * 60):
        clock.advance(59)
        consumer.run_until_idle()
        assert q.toplevel.get_pointer(zone) is not None
    assert consumer.run_until_idle() == 0
    clock.advance(3600)
    assert consumer.run_until_idle() == 1


def test_a_zone_emptied_long_ago_is_collected(q: Quick, clock: ManualClock) -> None:
    q.job("job")(lambda payload, ctx: None)
    q.enqueue("job", b"", app="app", tenant="done")
    consumer = q.consumer(CONFIG)
    assert consumer.run_until_idle() == 1
    assert q.toplevel.get_pointer(q.zone("app", "done")) is not None  # active just now
    clock.advance(31)  # past the item's lease (30 s), where the visit requeued the pointer
    consumer.run_until_idle()
    assert q.toplevel.get_pointer(q.zone("app", "done")) is None


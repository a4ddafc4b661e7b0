"""A scan passes over a zone of which the consumer already holds enough items
(``skip_held_zones_at``): while a backlog's items fill the workers, visiting its zone again
each scan only costs the visit (about 1 ms of CPU per zone on sqlite) and puts more of
its items in the local queue; the small tenants' visits are what the consumer is short of."""

from __future__ import annotations

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError


def test_a_zone_holding_enough_items_is_passed_over_until_some_finish(
    q: Quick, clock: ManualClock
) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.enqueue_many("j", list(range(20)), app="app", tenant="big")
    config = ConsumerConfig(dequeue_max=3, visit_max=3, skip_held_zones_at=2, in_order=True)
    consumer = q.consumer(config)
    held = consumer.visit_many(consumer.scan_once())
    assert [w.zone.tenant for w in held] == ["big"] * 3  # a visit still takes dequeue_max
    clock.advance(1.0)
    q.enqueue("j", "hello", app="app", tenant="small")

    refs = consumer.scan_once()
    assert [w.zone.tenant for w in consumer.visit_many(refs)] == ["small"]
    assert consumer.scanner.left_vested  # the big zone is still due, only passed over

    for work in held[:2]:
        consumer.execute(work)  # one item of "big" held now: below the mark
    assert [w.zone.tenant for w in consumer.visit_many(consumer.scan_once())] == ["big"] * 3


def test_without_the_setting_a_zone_is_visited_however_many_it_holds(
    q: Quick, clock: ManualClock
) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.enqueue_many("j", list(range(20)), app="app", tenant="big")
    consumer = q.consumer(ConsumerConfig(dequeue_max=3, visit_max=3, in_order=True))
    consumer.visit_many(consumer.scan_once())
    assert [w.zone.tenant for w in consumer.visit_many(consumer.scan_once())] == ["big"] * 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_a_mark_below_one_or_not_a_whole_number_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="skip_held_zones_at"):
        ConsumerConfig(skip_held_zones_at=bad).validate()  # type: ignore[arg-type]

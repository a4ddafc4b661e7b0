"""A visit hands its items to workers as soon as they are dequeued (paper Algorithm 2),
before the pointer's requeue commits: a timer's handler waits for no more commits than it
must (issue 15 point 5, exact timers)."""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.state import Work

# The three-transaction visit (one_transaction_visits=False) is the one with a hand-out
# between its commits; a one-transaction visit hands out after its one commit.
IN_ORDER = ConsumerConfig(  # the paper's visits: at most dequeue_max (visit_max)
    in_order=True,
    dequeue_max=10,
    visit_max=10,
    one_transaction_visits=False,
    processing_bound=20,
    # It scans again while holding the visit's 10 items: no zone is passed over for them.
    skip_held_zones_at=100,
)


def test_items_reach_workers_while_the_pointer_is_still_leased(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    for n in range(12):  # two more than one visit takes
        q.enqueue("j", n, app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    handed: list[tuple[int, list[str]]] = []

    def hand_out(works: list[Work]) -> None:
        # The zone's pointer is still leased by this visit: no scan sees it vested.
        handed.append((len(works), [r.pointer_id for r in consumer.scan_once()]))

    works = consumer.manager.visit(ref, hand_out)

    assert len(works) == 10 and handed == [(10, [])]
    # Requeued after the hand-out at the zone's minimum vesting time: the two left vest now.
    assert [r.pointer_id for r in consumer.scan_once()] == [ref.pointer_id]


def test_a_visit_that_takes_nothing_hands_out_nothing(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    item_id = q.enqueue("j", 1, app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    q.cancel("app", "t1", item_id)  # gone between the scan and the visit
    handed: list[list[Work]] = []

    assert consumer.manager.visit(ref, handed.append) == [] and handed == []

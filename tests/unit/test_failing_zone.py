"""A failing zone fails alone (issue 40, point 4).

The complaint: a zone whose visit kept failing (a store error of its own) was batched
with three others, the batch's transaction failed, the error reached the scanner and the
whole consumer backed off; the next scan chose the same batch. The three zones batched
with it never ran, and a trickle tenant's median pickup went from 3-5 ms to 115-1,585 ms.
Now a failed batch is written off and each of its zones visited alone, and the failing
zone is set aside on a backoff of its own (``zone_set_aside``); the consumer's own backoff
(``visits_backed_off``) is left for a store that fails every zone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.visit_rules import ZoneVisitsFailed
from quickzones.errors import StorageError
from quickzones.store.records import WorkItem, ZoneId
from tests.waiting import wait_for

CONFIG = ConsumerConfig(
    in_order=True,  # oldest pointers first: the failing zone is chosen in every scan
    one_transaction_visits=True,
    visits_per_transaction=4,
    selection_frac=1.0,
    idle_sleep_s=0.01,
)


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        self.seen.append((event, fields))

    def count(self, name: str) -> int:
        return sum(1 for event, _ in self.seen if event == name)

    def fields(self, name: str) -> list[dict[str, Any]]:
        return [f for event, f in self.seen if event == name]


def _failing_for_poison(inner: Any) -> Any:
    """The consumer's admission, but a "poison" item's zone fails its every visit with a
    store error of its own (what an unreadable record or an item past a store limit
    does)."""

    def factory(reserved: dict[str, str]) -> Any:
        accept = inner(reserved)

        def check(item: WorkItem) -> bool:
            if item.job_type == "poison":
                raise StorageError("this zone's record cannot be read")
            return bool(accept(item))

        return check

    return factory


def test_a_failing_zone_is_set_aside_and_every_other_zone_runs(real_q: Quick) -> None:
    q = real_q
    ran: Counter[str] = Counter()
    q.job("j")(lambda payload, ctx: ran.update([ctx.item_id]))
    q.job("poison")(lambda payload, ctx: ran.update(["poison ran"]))
    q.enqueue("poison", 0, app="app", tenant="bad")  # the oldest pointer: in every batch
    ids = [q.enqueue("j", n, app="app", tenant=f"t{n % 7}") for n in range(14)]
    events = _Events()
    consumer = q.consumer(CONFIG, observer=events)
    consumer.manager.accept_factory = _failing_for_poison(consumer.manager.accept_factory)
    consumer.start()
    try:
        # Every zone batched with the failing one, and every other, runs all its items.
        assert wait_for(lambda: sum(ran.values()) >= len(ids), 30), (len(ran), events.seen[-20:])
        # A trickle tenant: one item at a time, each picked up while the zone keeps failing.
        for n in range(10):
            item_id = q.enqueue("j", n, app="app", tenant="trickle")
            assert wait_for(lambda item_id=item_id: ran[item_id] == 1, 30), (n, events.seen[-20:])
        assert wait_for(lambda: len(events.fields("zone_set_aside")) >= 3, 30)
    finally:
        consumer.stop()
    assert "poison ran" not in ran
    assert all(ran[item_id] == 1 for item_id in ids) and set(ran.values()) == {1}, ran
    aside = events.fields("zone_set_aside")
    # Only the failing zone, on its own backoff: its failures in a row count up, and each
    # retry waits at least half of 0.05 s doubled per failure (set_aside.ZONE_BASE_S),
    # at most 10 s.
    assert len({f["pointer_id"] for f in aside}) == 1, aside
    assert max(f["failures"] for f in aside) >= 3, aside
    least = [min(5.0, 0.025 * 2 ** (f["failures"] - 1)) - 0.001 for f in aside]  # 10 s cap
    assert all(f["retry_in_s"] >= at_least for f, at_least in zip(aside, least, strict=True)), aside
    # The consumer as a whole never backed off for it.
    assert events.count("visits_backed_off") == 0, events.fields("visits_backed_off")


def test_zones_batched_with_a_failing_one_are_visited_in_the_same_call(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    q.job("poison")(lambda payload, ctx: None)
    q.enqueue("poison", 0, app="app", tenant="bad")
    ids = [q.enqueue("j", n, app="app", tenant=f"t{n}") for n in range(3)]
    config = ConsumerConfig(
        in_order=True, one_transaction_visits=True, visits_per_transaction=4, processing_bound=32
    )
    consumer = q.consumer(config)
    consumer.manager.accept_factory = _failing_for_poison(consumer.manager.accept_factory)
    refs = consumer.scan_once()
    assert len(refs) == 4
    bad = q.toplevel.get_pointer(ZoneId("app", "bad"))
    assert bad is not None
    with pytest.raises(ZoneVisitsFailed) as raised:  # a StorageError: the scanner's to count
        consumer.visit_many(refs)
    # Only the failing zone is named (the scanner sets it aside) and left vested; the
    # three batched with it were visited in the same call, each alone.
    assert [ref.pointer_id for ref, _ in raised.value.failed] == [bad.pointer_id]
    assert "cannot be read" in str(raised.value)
    for n, item_id in enumerate(ids):
        item = q.items.get(ZoneId("app", f"t{n}"), item_id)
        assert item is not None and item.lease_id is not None and item.attempts == 1
    assert [r.pointer_id for r in consumer.scan_once()] == [bad.pointer_id]

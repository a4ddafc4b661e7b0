"""One at a time per key (issue 45 point 1, docs/flow-control.md): the items enqueued with
one ``one_at_a_time`` key of a zone run serially, in enqueue order, whoever leases them;
the key passes to the next item when its holder completes, is cancelled or dead-lettered,
and stays with a retried item or one whose lease lapsed.

Every backend (memory, sqlite, fdbsim, fdb and postgres where they run) via the ``q``
fixture, on a manual clock; the zone store's dequeue is what every consumer (and the pull
leases of ``quick serve``) leases with.
"""

from __future__ import annotations

from typing import Any

import pytest

from quickzones import InvalidArgument, PermanentError
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.explain import explain
from quickzones.store.records import WorkItem, ZoneId
from tests.unit.helpers import enqueued_at_once

Z = ZoneId("shop", "user-1")
LEASE_MS = 30_000


def _enqueue(q: Quick, payload: Any = b"p", **options: Any) -> str:
    return q.enqueue("sync", payload, app=Z.app, tenant=Z.tenant, **options)


def _lease(q: Quick) -> list[WorkItem]:
    leased, _ = q.items.dequeue(Z, 10, LEASE_MS)
    return leased


def _payloads(items: list[WorkItem]) -> list[bytes]:
    return sorted(i.payload for i in items)


def test_a_keys_items_run_one_at_a_time_in_enqueue_order(q: Quick) -> None:
    # Enqueue order wins over priority and vesting: the second has a better priority,
    # the third vested earlier than the first.
    _enqueue(q, b"1", one_at_a_time="acct-7", priority=5)
    _enqueue(q, b"2", one_at_a_time="acct-7", priority=-5)
    _enqueue(q, b"other", priority=9)
    _enqueue(q, b"3", one_at_a_time="acct-7")
    assert q.zones.count(Z) == 4
    order: list[bytes] = []
    while True:
        leased = _lease(q)
        if not leased:
            break
        keyed = [i for i in leased if i.payload != b"other"]
        assert len(keyed) <= 1, "two items of one key leased at once"
        order += [i.payload for i in keyed]
        for item in leased:
            assert item.lease_id is not None
            q.items.complete(Z, item.item_id, item.lease_id)
    assert order == [b"1", b"2", b"3"]
    assert q.zones.count(Z) == 0
    assert _key_rows(q) == []


def test_keys_are_per_key_and_tenant(q: Quick) -> None:
    _enqueue(q, b"a", one_at_a_time="k1")
    _enqueue(q, b"b", one_at_a_time="k2")
    q.enqueue("sync", b"c", app=Z.app, tenant="user-2", one_at_a_time="k1")
    assert _payloads(_lease(q)) == [b"a", b"b"]
    leased, _ = q.items.dequeue(ZoneId(Z.app, "user-2"), 10, LEASE_MS)
    assert _payloads(leased) == [b"c"]


def test_a_retried_holder_keeps_the_key_through_its_backoff(q: Quick, clock: ManualClock) -> None:
    _enqueue(q, b"1", one_at_a_time="k")
    _enqueue(q, b"2", one_at_a_time="k")
    [first] = _lease(q)
    assert first.lease_id is not None
    q.items.requeue(Z, first.item_id, first.lease_id, 10_000, error="boom")
    assert _lease(q) == []  # the holder backs off; the next must not overtake it
    clock.advance(11)
    [again] = _lease(q)
    assert again.item_id == first.item_id
    assert again.lease_id is not None
    q.items.complete(Z, again.item_id, again.lease_id)
    assert _payloads(_lease(q)) == [b"2"]


def test_a_lapsed_lease_keeps_the_key_with_the_item_run_again(q: Quick, clock: ManualClock) -> None:
    _enqueue(q, b"1", one_at_a_time="k")
    _enqueue(q, b"2", one_at_a_time="k")
    [first] = _lease(q)  # its consumer crashes
    clock.advance(LEASE_MS / 1000 + 1)
    [again] = _lease(q)
    assert again.item_id == first.item_id
    assert _lease(q) == []


@pytest.mark.parametrize("end", ["cancel", "dead_letter"])
def test_the_key_passes_when_the_holder_is_cancelled_or_dead_lettered(q: Quick, end: str) -> None:
    first = _enqueue(q, b"1", one_at_a_time="k")
    _enqueue(q, b"2", one_at_a_time="k")
    if end == "cancel":
        q.cancel(Z.app, Z.tenant, first)
    else:

        def fail(payload: bytes, ctx: Any) -> None:
            if payload == b"1":
                raise PermanentError("no")

        q.job("sync")(fail)
        [item] = _lease(q)
        assert item.lease_id is not None
        q.items.dead_letter(Z, item.item_id, item.lease_id, "no")
    assert _payloads(_lease(q)) == [b"2"]


def test_a_waiting_item_cancelled_leaves_the_line(q: Quick) -> None:
    _enqueue(q, b"1", one_at_a_time="k")
    second = _enqueue(q, b"2", one_at_a_time="k")
    _enqueue(q, b"3", one_at_a_time="k")
    q.cancel(Z.app, Z.tenant, second)
    [first] = _lease(q)
    assert first.lease_id is not None
    q.items.complete(Z, first.item_id, first.lease_id)
    assert _payloads(_lease(q)) == [b"3"]


def test_consumers_run_them_serially(q: Quick) -> None:
    running: list[int] = []
    seen: list[bytes] = []

    def handler(payload: bytes, ctx: Any) -> None:
        running.append(1)
        assert len(running) == 1
        seen.append(payload)
        running.pop()

    q.job("sync")(handler)
    for n in range(6):
        _enqueue(q, str(n).encode(), one_at_a_time="k", priority=-n)
    q.run_until_idle()
    assert seen == [str(n).encode() for n in range(6)]


def test_an_enqueue_in_the_apps_transaction_and_a_rollback(q: Quick) -> None:
    class Rollback(Exception):
        pass

    def body(tr: Any) -> None:
        _enqueue(q, b"gone", one_at_a_time="k", tr=tr)
        raise Rollback

    with pytest.raises(Rollback):
        q.transact(body)
    q.transact(lambda tr: _enqueue(q, b"1", one_at_a_time="k", tr=tr))
    q.transact(lambda tr: _enqueue(q, b"2", one_at_a_time="k", tr=tr))
    assert _payloads(_lease(q)) == [b"1"]


def test_racing_enqueues_of_one_key_all_wait_in_line(q: Quick) -> None:
    ids = enqueued_at_once(lambda n, i: _enqueue(q, f"{n}-{i}".encode(), one_at_a_time="k"))
    assert len(set(ids)) == len(ids)
    ran = 0
    while True:
        leased = _lease(q)
        if not leased:
            break
        assert len(leased) == 1
        assert leased[0].lease_id is not None
        q.items.complete(Z, leased[0].item_id, leased[0].lease_id)
        ran += 1
    assert ran == len(ids)


def test_explain_names_the_holder(q: Quick) -> None:
    first = _enqueue(q, b"1", one_at_a_time="k")
    second = _enqueue(q, b"2", one_at_a_time="k")
    why = explain(q, Z.app, Z.tenant, second)
    [rule] = [r for r in why.rules if r.name == "one_at_a_time"]
    assert rule.holds and rule.items == (first,) and first in rule.detail
    mine = [r for r in explain(q, Z.app, Z.tenant, first).rules if r.name == "one_at_a_time"]
    assert [r.holds for r in mine] == [False]


@pytest.mark.parametrize(
    "options",
    [
        {"one_at_a_time": ""},
        {"one_at_a_time": 7},
        {"one_at_a_time": "k", "idempotency_key": "i"},
    ],
)
def test_bad_one_at_a_time_arguments_are_refused(q: Quick, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as err:
        _enqueue(q, **options)
    assert err.value.name == "one_at_a_time"
    assert q.zones.count(Z) == 0


def _key_rows(q: Quick) -> list[tuple[bytes, bytes]]:
    begin, end = q.keys.flow_keys_range()
    return q.transact(lambda tr: tr.get_range(begin, end))


def test_at_most_once_items_hold_the_key_until_their_run_ends(q: Quick) -> None:
    seen: list[tuple[bytes, int]] = []

    def handler(payload: bytes, ctx: Any) -> None:
        # Deleted from the zone as it starts: the next of its key is still not leased.
        seen.append((payload, len(_lease(q))))

    q.job("sync", delivery="at_most_once")(handler)
    for n in range(3):
        _enqueue(q, str(n).encode(), one_at_a_time="k")
    q.run_until_idle()
    assert seen == [(b"0", 0), (b"1", 0), (b"2", 0)]
    assert _key_rows(q) == []


def test_a_dead_letter_put_back_joins_its_keys_line(q: Quick) -> None:
    first = _enqueue(q, b"1", one_at_a_time="k")
    _enqueue(q, b"2", one_at_a_time="k")
    [one] = _lease(q)
    assert one.item_id == first and one.lease_id is not None
    q.items.dead_letter(Z, one.item_id, one.lease_id, "no")
    [two] = _lease(q)  # the key passed on; the second runs
    assert two.payload == b"2" and two.lease_id is not None
    q.requeue_dead_letter(Z.app, Z.tenant, first)
    assert _lease(q) == []  # not beside the running holder
    q.items.complete(Z, two.item_id, two.lease_id)
    assert [i.item_id for i in _lease(q)] == [first]

"""Debounce per key (issue 45 point 1, docs/flow-control.md): enqueues of one key keep one
stored item whose payload is the newest, vesting when the key has been quiet ``wait_s`` or
``max_wait_s`` after the first of them, whichever comes first. An item already running is
left alone: the next enqueue starts a new one.

Every backend via the ``q`` fixture, on a manual clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from quickzones import Debounce, InvalidArgument
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.records import ZoneId
from tests.unit.helpers import enqueued_at_once

Z = ZoneId("search", "user-1")


def _enqueue(q: Quick, payload: Any, **options: Any) -> str:
    return q.enqueue("reindex", payload, app=Z.app, tenant=Z.tenant, **options)


def _collect(q: Quick) -> list[Any]:
    ran: list[Any] = []
    q.job("reindex")(lambda payload, ctx: ran.append(payload))
    return ran


def test_the_issue_target_1000_enqueues_in_2s_run_one_job_with_the_newest_payload(
    q: Quick, clock: ManualClock
) -> None:
    ran = _collect(q)
    d = Debounce("doc-1", wait_s=0.5, max_wait_s=5)
    ids = set()
    for n in range(1000):
        ids.add(_enqueue(q, {"n": n}, debounce=d))
        clock.advance(0.002)
        if n % 100 == 99:
            q.run_until_idle()  # a consumer polling meanwhile finds nothing vested
    assert len(ids) == 1
    assert ran == []
    assert q.zones.count(Z) == 1
    clock.advance(0.5)
    q.run_until_idle()
    assert ran == [{"n": 999}]
    assert q.zones.count(Z) == 0


def test_quiet_for_wait_s_vests_the_item(q: Quick, clock: ManualClock) -> None:
    ran = _collect(q)
    d = Debounce("k", wait_s=1.0, max_wait_s=60)
    first = _enqueue(q, b"a", debounce=d)
    assert first.duplicate is None  # type: ignore[attr-defined]
    clock.advance(0.6)
    again = _enqueue(q, b"b", debounce=d)
    assert again == first and again.duplicate == "debounced"  # type: ignore[attr-defined]
    clock.advance(0.6)  # 1.2 s after the first, 0.6 after the last: not quiet yet
    q.run_until_idle()
    assert ran == []
    clock.advance(0.4)
    q.run_until_idle()
    assert ran == [b"b"]


def test_max_wait_s_bounds_the_delay_of_a_never_quiet_key(q: Quick, clock: ManualClock) -> None:
    ran = _collect(q)
    d = Debounce("k", wait_s=1.0, max_wait_s=3.0)
    for n in range(10):  # one enqueue every 0.5 s: never quiet for 1 s
        _enqueue(q, n, debounce=d)
        q.run_until_idle()
        clock.advance(0.5)
    # The first came at t=0: the item ran at t=3 with the payload newest by then.
    assert ran == [6]


def test_a_running_item_is_not_modified_a_new_one_is_started(q: Quick, clock: ManualClock) -> None:
    d = Debounce("k", wait_s=0.5, max_wait_s=5)
    ran: list[Any] = []
    during: list[str] = []

    def handler(payload: Any, ctx: Any) -> None:
        ran.append(payload)
        if payload == "first":
            new = _enqueue(q, "second", debounce=d)
            assert new != ctx.item_id
            during.append(new)

    q.job("reindex")(handler)
    first = _enqueue(q, "first", debounce=d)
    clock.advance(0.5)
    q.run_until_idle()
    assert ran == ["first"] and during and during[0] != first
    clock.advance(0.5)
    q.run_until_idle()
    assert ran == ["first", "second"]


def test_keys_are_per_tenant_and_per_key(q: Quick, clock: ManualClock) -> None:
    ran = _collect(q)
    d1, d2 = Debounce("a", wait_s=0.1, max_wait_s=1), Debounce("b", wait_s=0.1, max_wait_s=1)
    _enqueue(q, "a1", debounce=d1)
    _enqueue(q, "b1", debounce=d2)
    q.enqueue("reindex", "other", app=Z.app, tenant="user-2", debounce=d1)
    clock.advance(0.2)
    q.run_until_idle()
    assert sorted(ran) == ["a1", "b1", "other"]


def test_a_debounce_in_a_rolled_back_transaction_changes_nothing(
    q: Quick, clock: ManualClock
) -> None:
    ran = _collect(q)
    d = Debounce("k", wait_s=0.5, max_wait_s=5)
    _enqueue(q, "kept", debounce=d)

    class Rollback(Exception):
        pass

    def body(tr: Any) -> None:
        _enqueue(q, "rolled back", debounce=d, tr=tr)
        raise Rollback

    with pytest.raises(Rollback):
        q.transact(body)
    clock.advance(0.5)
    q.run_until_idle()
    assert ran == ["kept"]


def test_two_threads_debouncing_one_key_keep_one_item(q: Quick, clock: ManualClock) -> None:
    d = Debounce("k", wait_s=10, max_wait_s=60)
    ids = enqueued_at_once(lambda n, i: _enqueue(q, f"{n}-{i}", debounce=d))
    assert len(set(ids)) == 1
    assert q.zones.count(Z) == 1


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Debounce("", 1, 2), "debounce.key"),
        (lambda: Debounce("k", -1, 2), "debounce.wait_s"),
        (lambda: Debounce("k", 2, 1), "debounce.max_wait_s"),
    ],
)
def test_bad_debounce_arguments_are_refused(make: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        make()
    assert err.value.name == field


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"idempotency_key": "k"}, "debounce"),
        ({"item_id": "mine"}, "debounce"),
        ({"delay": 5}, "debounce"),
    ],
)
def test_debounce_refuses_options_it_cannot_combine_with(
    q: Quick, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        _enqueue(q, b"x", debounce=Debounce("k", 1, 2), **options)
    assert err.value.name == field
    assert q.zones.count(Z) == 0


def test_debounce_must_be_a_debounce(q: Quick) -> None:
    with pytest.raises(InvalidArgument) as err:
        _enqueue(q, b"x", debounce={"key": "k"})
    assert err.value.name == "debounce"

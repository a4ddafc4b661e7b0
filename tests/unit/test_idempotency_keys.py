"""Idempotency keys (issue 45 point 1, docs/flow-control.md): an enqueue naming a key held
by a queued or running item of its zone stores nothing and returns that item's id; the key
is released in the transaction that finishes the item, or ``idempotency_ttl_s`` after it.

Every backend (memory, sqlite, fdbsim, fdb and postgres where they run) via the ``q``
fixture, on a manual clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from quickzones import InvalidArgument, PermanentError
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVError
from quickzones.store.records import ZoneId
from tests.unit.helpers import enqueued_at_once

Z = ZoneId("shop", "user-1")


def _enqueue(q: Quick, payload: Any = b"p", **options: Any) -> str:
    return q.enqueue("charge", payload, app=Z.app, tenant=Z.tenant, **options)


def test_a_duplicate_while_queued_returns_the_first_id_and_stores_nothing(q: Quick) -> None:
    first = _enqueue(q, b"a", idempotency_key="order-7")
    again = _enqueue(q, b"b", idempotency_key="order-7")
    assert again == first
    assert getattr(first, "duplicate", "unset") is None
    assert again.duplicate == "queued"  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 1
    ran: list[bytes] = []
    q.job("charge")(lambda payload, ctx: ran.append(payload))
    q.run_until_idle()
    assert ran == [b"a"]


def test_keys_are_per_app_and_tenant(q: Quick) -> None:
    one = _enqueue(q, idempotency_key="k")
    other = q.enqueue("charge", b"p", app=Z.app, tenant="user-2", idempotency_key="k")
    assert other != one and q.zones.count(ZoneId(Z.app, "user-2")) == 1


def test_a_duplicate_while_running_is_refused_and_the_key_frees_on_completion(
    q: Quick, clock: ManualClock
) -> None:
    seen: list[str] = []

    def handler(payload: bytes, ctx: Any) -> None:
        # The item is leased (running): another enqueue of the key is a duplicate.
        dup = _enqueue(q, b"during", idempotency_key="order-7")
        seen.append(dup.duplicate or "new")  # type: ignore[attr-defined]
        assert dup == ctx.item_id

    q.job("charge")(handler)
    _enqueue(q, b"first", idempotency_key="order-7")
    q.run_until_idle()
    assert seen == ["queued"]
    assert q.zones.count(Z) == 0
    after = _enqueue(q, b"after", idempotency_key="order-7")
    assert after.duplicate is None  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 1


def test_the_key_frees_when_the_item_is_dead_lettered(q: Quick) -> None:
    def fail(payload: bytes, ctx: Any) -> None:
        raise PermanentError("no")

    q.job("charge")(fail)
    first = _enqueue(q, idempotency_key="k")
    q.run_until_idle()
    assert [d.item_id for d in q.dead_letters()] == [first]
    again = _enqueue(q, idempotency_key="k")
    assert again != first and again.duplicate is None  # type: ignore[attr-defined]


def test_the_key_frees_when_the_item_is_cancelled(q: Quick) -> None:
    first = _enqueue(q, idempotency_key="k")
    q.cancel(Z.app, Z.tenant, first)
    assert _enqueue(q, idempotency_key="k") != first


def test_a_crash_before_completion_keeps_the_key_held(q: Quick, clock: ManualClock) -> None:
    first = _enqueue(q, idempotency_key="k")
    # A consumer leases the item and dies before completing it.
    leased, _ = q.items.dequeue(Z, 1, 30_000)
    assert [i.item_id for i in leased] == [first]
    clock.advance(60)  # its lease lapsed: the item is visible again, still unfinished
    assert _enqueue(q, idempotency_key="k") == first
    ran: list[str] = []
    q.job("charge")(lambda payload, ctx: ran.append(ctx.item_id))
    q.run_until_idle()
    assert ran == [first]
    assert _enqueue(q, idempotency_key="k") != first


def test_a_ttl_keeps_the_key_after_finishing_then_releases_it(q: Quick, clock: ManualClock) -> None:
    q.job("charge")(lambda payload, ctx: None)
    first = _enqueue(q, idempotency_key="k", idempotency_ttl_s=60)
    q.run_until_idle()
    clock.advance(30)
    dup = _enqueue(q, idempotency_key="k", idempotency_ttl_s=60)
    assert dup == first and dup.duplicate == "completed"  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 0
    clock.advance(31)
    fresh = _enqueue(q, idempotency_key="k", idempotency_ttl_s=60)
    assert fresh != first and fresh.duplicate is None  # type: ignore[attr-defined]


def test_expired_key_records_are_collected(q: Quick, clock: ManualClock) -> None:
    q.job("charge")(lambda payload, ctx: None)
    _enqueue(q, idempotency_key="k", idempotency_ttl_s=5)
    q.run_until_idle()
    assert _key_rows(q)
    clock.advance(6)
    q.collect_outcomes()
    assert _key_rows(q) == []


def _key_rows(q: Quick) -> list[tuple[bytes, bytes]]:
    begin, end = q.keys.flow_keys_range()
    return q.transact(lambda tr: tr.get_range(begin, end))


def test_an_enqueue_in_a_rolled_back_transaction_holds_no_key(q: Quick) -> None:
    class Rollback(Exception):
        pass

    def body(tr: Any) -> None:
        _enqueue(q, idempotency_key="k", tr=tr)
        raise Rollback

    with pytest.raises(Rollback):
        q.transact(body)
    assert _enqueue(q, idempotency_key="k").duplicate is None  # type: ignore[attr-defined]


def test_two_open_transactions_on_one_key_store_one_item(backend: str, q: Quick) -> None:
    if backend in ("sqlite", "postgres"):
        pytest.skip("one writer at a time: the second blocks instead of conflicting")
    tr1, tr2 = q.kv.create_transaction(), q.kv.create_transaction()
    _enqueue(q, b"1", idempotency_key="k", tr=tr1)
    _enqueue(q, b"2", idempotency_key="k", tr=tr2)
    tr1.commit()
    with pytest.raises(KVError):
        tr2.commit()
    assert q.zones.count(Z) == 1


def test_two_threads_enqueueing_one_key_store_one_item(q: Quick) -> None:
    ids = enqueued_at_once(lambda n, i: _enqueue(q, f"{n}-{i}".encode(), idempotency_key="k"))
    assert len(set(ids)) == 1
    assert q.zones.count(Z) == 1


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": 7}, "idempotency_key"),
        ({"idempotency_key": "k", "idempotency_ttl_s": -1}, "idempotency_ttl_s"),
        ({"idempotency_ttl_s": 5}, "idempotency_ttl_s"),
    ],
)
def test_bad_idempotency_arguments_are_refused(
    q: Quick, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        _enqueue(q, **options)
    assert err.value.name == field
    assert q.zones.count(Z) == 0


def test_an_at_most_once_item_releases_its_key_when_its_run_ends(q: Quick) -> None:
    seen: list[str] = []

    def handler(payload: bytes, ctx: Any) -> None:
        # Taken out of its zone before it runs, it still holds the key while running.
        seen.append(_enqueue(q, idempotency_key="k").duplicate or "new")  # type: ignore[attr-defined]

    q.job("charge", delivery="at_most_once")(handler)
    first = _enqueue(q, idempotency_key="k")
    q.run_until_idle()
    assert seen == ["queued"]
    assert _enqueue(q, idempotency_key="k") != first


def test_asyncquick_takes_the_same_options() -> None:
    import asyncio

    from quickzones import AsyncQuick, Debounce

    async def main() -> tuple[str, str, str]:
        async with AsyncQuick.open("memory://") as aq:
            a = await aq.enqueue("charge", b"1", app="a", tenant="t", idempotency_key="k")
            b = await aq.enqueue("charge", b"2", app="a", tenant="t", idempotency_key="k")
            d = await aq.enqueue("charge", b"3", app="a", tenant="t", debounce=Debounce("d", 1, 2))
            return a, b, d

    a, b, d = asyncio.run(main())
    assert a == b and b.duplicate == "queued"  # type: ignore[attr-defined]
    assert d not in (a, b)

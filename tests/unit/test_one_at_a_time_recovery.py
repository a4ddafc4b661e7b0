"""One-at-a-time keys that lose their holder's word (issue 45 point 1, review edges 1 and 2,
docs/flow-control.md "Where the keys live"): a key record that does not decode is held by
an unknown holder, never free, and is repaired by the holder's next write; an at-most-once
holder's key carries its run's lease, and passes to the next item once a crashed run's
lease lapses (the crashed item is never run again).

Every backend (memory, sqlite, fdbsim, fdb and postgres where they run) via the ``q``
fixture, on a manual clock; ``Quick.collect_outcomes`` is the step a consumer's maintenance
runs; the zone store's dequeue is what every consumer leases with.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.explain import explain
from quickzones.store import flow_keys
from quickzones.store.records import WorkItem, ZoneId
from tests.unit.helpers import enqueued_at_once

Z = ZoneId("shop", "user-1")
LEASE_MS = 30_000
GARBAGE = b"\xc1 not msgpack"


def _enqueue(q: Quick, payload: bytes, job: str = "sync", key: str = "k") -> str:
    return q.enqueue(job, payload, app=Z.app, tenant=Z.tenant, one_at_a_time=key)


def _lease(q: Quick) -> list[WorkItem]:
    leased, _ = q.items.dequeue(Z, 10, LEASE_MS)
    return leased


def _corrupt(q: Quick, key: str = "k") -> None:
    q.transact(lambda tr: tr.set(q.keys.flow_key(Z, flow_keys.ONE_AT_A_TIME, key), GARBAGE))


def _record(q: Quick) -> flow_keys.KeyRecord | None:
    key = q.keys.flow_key(Z, flow_keys.ONE_AT_A_TIME, "k")
    raw = q.transact(lambda tr: tr.get(key))
    return None if raw is None else flow_keys.decode_record(key, raw)


def _done(q: Quick, item: WorkItem) -> None:
    assert item.lease_id is not None
    q.items.complete(Z, item.item_id, item.lease_id)


def _take(q: Quick, item: WorkItem) -> None:
    """What a consumer does as an at-most-once handler starts: delete it, holding its lease."""
    assert item.lease_id is not None
    assert q.items.complete_many(Z, [(item.item_id, item.lease_id)]) == [None]


# --- a corrupt record --------------------------------------------------------------------


def test_a_corrupt_record_never_lets_a_second_item_of_the_key_start(q: Quick) -> None:
    _enqueue(q, b"1")
    [one] = _lease(q)  # running
    _corrupt(q)
    second = _enqueue(q, b"2")
    third = _enqueue(q, b"3")
    assert _lease(q) == []  # the holder is unknown, not gone: both wait
    why = explain(q, Z.app, Z.tenant, second)
    [rule] = [r for r in why.rules if r.name == "one_at_a_time"]
    assert rule.holds and "corrupt" in rule.detail and "'k'" in rule.detail
    # The holder's finish repairs the record and passes the key on, in enqueue order.
    _done(q, one)
    [two] = _lease(q)
    assert two.item_id == second
    record = _record(q)
    assert record is not None and record.item_id == second
    _done(q, two)
    [three] = _lease(q)
    assert three.item_id == third
    _done(q, three)
    assert _record(q) is None and q.zones.count(Z) == 0


def test_items_parked_before_the_corruption_keep_their_place(q: Quick) -> None:
    _enqueue(q, b"1")
    second = _enqueue(q, b"2")
    third = _enqueue(q, b"3")
    [one] = _lease(q)
    _corrupt(q)
    q.cancel(Z.app, Z.tenant, second)  # a waiting item leaves the line, the key stays held
    assert _lease(q) == []
    fourth = _enqueue(q, b"4")
    _done(q, one)
    order = []
    while leased := _lease(q):
        assert len(leased) == 1
        order.append(leased[0].item_id)
        _done(q, leased[0])
    assert order == [third, fourth]


def test_racing_enqueues_behind_a_corrupt_record_all_wait_in_line(q: Quick) -> None:
    _enqueue(q, b"0")
    [one] = _lease(q)
    _corrupt(q)
    ids = enqueued_at_once(lambda n, i: _enqueue(q, f"{n}-{i}".encode()))
    assert _lease(q) == []
    _done(q, one)
    ran = []
    while leased := _lease(q):
        assert len(leased) == 1  # never two of the key at once
        ran.append(leased[0].item_id)
        _done(q, leased[0])
    assert sorted(ran) == sorted(ids)  # none lost from the line (no number taken twice)


def test_a_corrupt_record_is_logged_once_with_its_key(
    q: Quick, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"k-{uuid.uuid4().hex}"  # logged once a process: a key no other test used
    _enqueue(q, b"1", key=key)
    _corrupt(q, key)
    with caplog.at_level(logging.WARNING, logger="quick.flow_keys"):
        for n in range(3):
            _enqueue(q, str(n).encode(), key=key)
    said = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(said) == 1 and repr(key) in said[0] and str(Z) in said[0]


def test_a_corrupt_record_whose_holder_is_gone_passes_on_after_the_lease(
    q: Quick, clock: ManualClock
) -> None:
    # An at-most-once holder taken (deleted as it starts), then its record corrupted,
    # then its process dies: nothing names a holder, and none is in the zone.
    q.job("once", delivery="at_most_once")(lambda payload, ctx: None)
    _enqueue(q, b"1", job="once")
    second = _enqueue(q, b"2")
    [one] = _lease(q)
    _take(q, one)
    _corrupt(q)
    q.collect_outcomes()
    assert _lease(q) == []
    clock.advance(LEASE_MS / 1000 + 1)
    q.collect_outcomes()
    [two] = _lease(q)
    assert two.item_id == second


def test_a_corrupt_record_with_a_live_holder_is_kept_by_maintenance(
    q: Quick, clock: ManualClock
) -> None:
    # The at-most-once item's run ends and passes the key on; the record of the next
    # holder (at least once, running) is corrupted: the stale lapse entry must not pass
    # the key a second time.
    q.job("once", delivery="at_most_once")(lambda payload, ctx: None)
    _enqueue(q, b"1", job="once")
    second = _enqueue(q, b"2")
    third = _enqueue(q, b"3")
    [one] = _lease(q)
    _take(q, one)
    q.items.record_outcome(Z, one, "completed")  # its run ended
    [two] = _lease(q)
    assert two.item_id == second
    _corrupt(q)
    clock.advance(LEASE_MS / 1000 + 1)
    q.collect_outcomes()
    record = _record(q)
    assert record is not None and record.item_id == second  # repaired, naming it
    # Its own lease lapsed meanwhile: it runs again, still holding the key; never the third.
    [again] = _lease(q)
    assert again.item_id == second
    _done(q, again)
    assert [i.item_id for i in _lease(q)] == [third]


# --- an at-most-once holder that never reports the end of its run -------------------------


def test_a_crashed_at_most_once_holder_frees_its_key_when_its_lease_lapses(
    q: Quick, clock: ManualClock
) -> None:
    ran: list[bytes] = []
    q.job("once", delivery="at_most_once")(lambda payload, ctx: ran.append(payload))
    first = _enqueue(q, b"1", job="once")
    second = _enqueue(q, b"2", job="once")
    [one] = _lease(q)
    _take(q, one)  # its handler starts; the process dies before the run ends
    clock.advance(LEASE_MS / 1000 - 1)
    q.collect_outcomes()
    assert _lease(q) == []  # the lease has not lapsed: the key is held
    why = explain(q, Z.app, Z.tenant, second)
    [rule] = [r for r in why.rules if r.name == "one_at_a_time"]
    assert rule.holds and rule.items == (first,)
    clock.advance(2)
    q.collect_outcomes()
    q.run_until_idle()
    assert ran == [b"2"]  # the next ran; the crashed one never runs again
    assert q.get(Z.app, Z.tenant, first) is None
    assert _record(q) is None and q.zones.count(Z) == 0


def test_an_at_most_once_holder_whose_run_ends_late_finds_the_key_passed(
    q: Quick, clock: ManualClock
) -> None:
    q.job("once", delivery="at_most_once")(lambda payload, ctx: None)
    _enqueue(q, b"1", job="once")
    second = _enqueue(q, b"2")
    third = _enqueue(q, b"3")
    [one] = _lease(q)
    _take(q, one)
    clock.advance(LEASE_MS / 1000 + 1)
    q.collect_outcomes()
    [two] = _lease(q)
    assert two.item_id == second
    q.items.record_outcome(Z, one, "completed")  # the lapsed run reports at last
    assert _lease(q) == []  # it passes nothing: the second holds the key
    _done(q, two)
    assert [i.item_id for i in _lease(q)] == [third]


def test_an_at_most_once_holders_extended_hold_keeps_the_key(q: Quick, clock: ManualClock) -> None:
    q.job("once", delivery="at_most_once")(lambda payload, ctx: None)
    _enqueue(q, b"1", job="once")
    second = _enqueue(q, b"2")
    [one] = _lease(q)
    _take(q, one)
    for _ in range(3):  # a long run: its consumer renews the hold as it would the lease
        clock.advance(LEASE_MS / 2000)
        until = q.items.extend_key_hold(Z, one, LEASE_MS)
        assert until == now_ms(clock) + LEASE_MS
        q.collect_outcomes()
        assert _lease(q) == []
    clock.advance(LEASE_MS / 1000 + 1)
    q.collect_outcomes()
    assert [i.item_id for i in _lease(q)] == [second]

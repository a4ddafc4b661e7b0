"""The two-part enqueue (docs/design.md "Enqueue and pointers") from a user's side.

Part two pulls an existing pointer's vesting earlier after part one commits. Whatever runs
the caller's transaction (``Quick.transact``, the KV ``run()``, a raw transaction committed
by hand, a transactional handler's ``ctx.tr``), an item enqueued into a zone whose pointer
vests far out must still be picked up promptly.
"""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVTransaction, run
from quickzones.store.records import ZoneId

Z = ZoneId("app", "t1")
HOUR = 3600.0


def _pointer_far_out(q: Quick, clock: ManualClock) -> None:
    """The zone's pointer vests an hour from now (its only item is delayed that long)."""
    q.enqueue("job", b"later", app=Z.app, tenant=Z.tenant, delay=HOUR)
    pointer = q.toplevel.get_pointer(Z)
    assert pointer is not None and pointer.vesting_ms >= int(clock.now() * 1000) + 3_000_000


def _ran_promptly(q: Quick, clock: ManualClock) -> list[bytes]:
    ran: list[bytes] = []
    q.job("job")(lambda payload, ctx: ran.append(payload))
    clock.advance(1)
    q.run_until_idle()
    return ran


def test_enqueue_inside_kv_run_pulls_the_pointer(q: Quick, clock: ManualClock) -> None:
    _pointer_far_out(q, clock)

    def body(tr: KVTransaction) -> None:
        tr.set(b"user/1", b"alice")
        q.enqueue("job", b"now", app=Z.app, tenant=Z.tenant, tr=tr)

    run(q.kv, body)
    assert _ran_promptly(q, clock) == [b"now"]


def test_enqueue_inside_hand_committed_transaction_pulls_the_pointer(
    q: Quick, clock: ManualClock
) -> None:
    _pointer_far_out(q, clock)
    tr = q.kv.create_transaction()
    q.enqueue("job", b"now", app=Z.app, tenant=Z.tenant, tr=tr)
    tr.commit()
    assert _ran_promptly(q, clock) == [b"now"]


def test_enqueue_inside_transact_pulls_the_pointer(q: Quick, clock: ManualClock) -> None:
    _pointer_far_out(q, clock)
    q.transact(lambda tr: q.enqueue("job", b"now", app=Z.app, tenant=Z.tenant, tr=tr))
    assert _ran_promptly(q, clock) == [b"now"]


def test_aborted_transaction_runs_no_part_two(q: Quick, clock: ManualClock) -> None:
    _pointer_far_out(q, clock)
    before = q.toplevel.get_pointer(Z)

    class Abort(Exception):
        pass

    def body(tr: KVTransaction) -> None:
        q.enqueue("job", b"never", app=Z.app, tenant=Z.tenant, tr=tr)
        raise Abort

    with pytest.raises(Abort):
        run(q.kv, body)
    assert q.toplevel.get_pointer(Z) == before
    assert q.zones.count(Z) == 1


def test_enqueue_from_transactional_handler_pulls_the_pointer(q: Quick, clock: ManualClock) -> None:
    """A transactional handler enqueues follow-up work into ``ctx.tr``; the consumer, not
    ``Quick.transact``, commits that transaction."""
    follow = ZoneId("app", "t2")
    q.enqueue("follow_up", b"later", app=follow.app, tenant=follow.tenant, delay=HOUR)
    ran: list[bytes] = []

    def first(payload: Any, ctx: Any) -> None:
        q.enqueue("follow_up", b"now", app=follow.app, tenant=follow.tenant, tr=ctx.tr)

    q.job("first", transactional=True)(first)
    q.job("follow_up")(lambda payload, ctx: ran.append(payload))
    q.enqueue("first", b"", app=Z.app, tenant=Z.tenant)
    q.run_until_idle()
    clock.advance(1)
    q.run_until_idle()
    assert ran == [b"now"]

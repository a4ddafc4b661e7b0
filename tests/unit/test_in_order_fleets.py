"""Exactly one in-order (sequential) scanner for every fleet shape (issue 40 point 5):
consumers on threads of one process, and fleets whose consumers are all routed to some
apps or job types. (Processes: ``tests/unit/test_in_order_processes.py``; remote pull
workers behind ``quick serve``: ``tests/serve/test_in_order_pull_fleet.py``.)

A pointer only the in-order scanner reaches: in a backlog of zones, the oldest vested
pointers, every scan, in their vesting order (a random scan takes one of them at random)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.runtime import Consumer
from quickzones.consumer.scanner_election import lease_name, route_of
from quickzones.consumer.store_election import StoreElection
from tests.waiting import wait_for

ZONES = 12


def _backlog(q: Quick, clock: ManualClock, app: str = "a") -> list[str]:
    """One item in each of ZONES zones of ``app``, each vesting 10 ms after the last; the
    tenants, oldest first."""
    tenants = [f"t{n:02d}" for n in range(ZONES)]
    for tenant in tenants:
        q.enqueue("j", b"", app=app, tenant=tenant)
        clock.advance(0.01)
    return tenants


def _holder(q: Quick, route: str = "") -> str | None:
    lease = StoreElection(q.kv, q.keys, q.clock).read(lease_name(q.toplevel.cluster, route))
    return lease.holder if lease is not None and lease.held_at(now_ms(q.clock)) else None


@pytest.fixture
def sqlite_q(tmp_path: Path) -> Iterator[Quick]:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    q.job("j")(lambda payload, ctx: None)
    yield q
    q.close()


def test_threaded_consumers_of_one_process_have_one_in_order_scanner(sqlite_q: Quick) -> None:
    q = sqlite_q
    ran: list[str] = []
    q.job("count")(lambda payload, ctx: ran.append(ctx.item_id))
    fleet = [q.consumer(ConsumerConfig(workers=1, managers=1), name=f"c{n}") for n in range(3)]
    for c in fleet:
        c.start()
    try:
        assert wait_for(lambda: sum(c.in_order for c in fleet) == 1)
        ids = [q.enqueue("count", b"", app="a", tenant=f"t{n}") for n in range(10)]
        assert wait_for(lambda: sorted(ran) == sorted(ids)), ran
        assert sum(c.in_order for c in fleet) == 1
        (holder,) = [c for c in fleet if c.in_order]
        assert _holder(q) == holder.name
    finally:
        for c in fleet:
            c.request_stop()


def test_a_fleet_routed_to_one_app_has_one_in_order_scanner_for_it() -> None:
    """Every consumer routed to app "a" (app "b" has items nobody serves: fine). Before:
    routed consumers stayed out of the election, so none of them scanned in order."""
    clock = ManualClock()
    q = Quick.open("memory://", clock=clock)
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", b"", app="b", tenant="nobody-serves")  # the oldest pointer: never ours
    clock.advance(0.01)
    tenants = _backlog(q, clock)
    routed = ConsumerConfig(apps=("a",), selection_max=ZONES + 1, dequeue_max=1)
    fleet = [q.consumer(routed, name=f"c{n}") for n in range(3)]
    for c in fleet:
        c.refresh_election()
    assert [c.in_order for c in fleet] == [True, False, False]
    assert _holder(q, route_of(("a",), None)) == "c0"
    assert _holder(q) is None  # the cluster's own lease: no consumer that takes everything
    # The in-order scanner takes a's zones oldest first (b's pointer is left alone).
    ran = _run_in_order(fleet[0])
    assert ran == tenants
    q.close()


def test_routed_and_unrouted_consumers_each_have_theirs() -> None:
    """A consumer that takes everything holds the cluster's lease; the consumers routed to
    "a" hold theirs: each set of zones has one in-order scanner, never a routed consumer
    holding the cluster's (it would leave the others' pointers without one)."""
    q = Quick.open("memory://", clock=ManualClock())
    q.job("j")(lambda payload, ctx: None)
    routed = [q.consumer(ConsumerConfig(apps=("a",)), name=f"a{n}") for n in range(2)]
    typed = q.consumer(ConsumerConfig(job_types=("j",)), name="typed")
    everything = q.consumer(ConsumerConfig(), name="all")
    for c in [*routed, typed, everything]:
        c.refresh_election()
    assert [c.in_order for c in routed] == [True, False]
    assert typed.in_order and everything.in_order
    assert _holder(q) == "all"
    assert _holder(q, route_of(("a",), None)) == "a0"
    assert _holder(q, route_of(None, ("j",))) == "typed"
    q.close()


def _run_in_order(consumer: Consumer) -> list[str]:
    """Scan, visit and run until idle; the tenants whose items ran, in order."""
    ran: list[str] = []
    for _ in range(ZONES * 2):
        refs = consumer.scan_once()
        if not refs:
            break
        for ref in refs:
            for work in consumer.visit(ref):
                ran.append(work.zone.tenant)
                consumer.execute(work)
    return ran

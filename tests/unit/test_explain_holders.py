"""``quick explain`` names who holds what (issue 45 point 3, the two answers
docs/explain.md listed as missing): the consumer whose visit holds an item's zone, read
from the pointer record the lease wrote (before, only the lease's id), and a job type's
pool-wide cap (``pool_max_concurrency``) with the consumers holding its slots."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.visit_rules import ZoneVisit
from quickzones.explain import Explanation, explain
from quickzones.store import heartbeats
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.records import Pointer, ZoneId, decode_pointer, encode_pointer
from tests.conftest import store_url

LEASE_MS = 30_000


@pytest.fixture(params=["memory", "sqlite"])
def q(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Quick]:
    quick = Quick.open(store_url(str(request.param), tmp_path), clock=clock)
    yield quick
    quick.close()


def _consumer(q: Quick, cid: str = "c1") -> None:
    now = now_ms(q.clock)
    record = Heartbeat(cid, "host", 1, now, now, 2000, 8, 0, 0, None, None, ())
    heartbeats.beat(q.kv, q.keys, record, now)


def _rule(e: Explanation, name: str) -> list[str]:
    return [r.detail for r in e.rules if r.name == name]


def test_the_zone_lease_names_the_consumer_holding_it(q: Quick, clock: ManualClock) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    zone = q.zone("a", "t")
    ref = q.toplevel.peek_pointers(q.toplevel.shard_for(zone), 10)[0]
    q.toplevel.obtain_pointer_lease(ref, 5_000, holder="c1")
    e = explain(q, "a", "t", item)
    assert e.first is not None and e.first.name == "zone_lease"
    until = now_ms(clock) + 5_000
    assert e.first.detail == f"zone leased by consumer c1 until {until}"
    assert e.first.consumers == ("c1",) and e.first.until_ms == until


@pytest.mark.parametrize("one", [False, True])
def test_a_consumers_visit_records_its_name_in_the_pointer_it_leases(q: Quick, one: bool) -> None:
    """The name travels with the visit's pointer lease (the same write), in both kinds of
    visit (three transactions, and one), and goes with the lease at the requeue."""
    consumer = q.consumer(ConsumerConfig(one_transaction_visits=one), name="worker-7")
    assert {c.holder for c in consumer.clusters.values()} == {"worker-7"}
    zone = q.zone("a", "t")
    q.enqueue("j", b"", app="a", tenant="t")
    pointer = q.toplevel.get_pointer(zone)
    assert pointer is not None and pointer.holder is None
    (ref,) = [
        r
        for r in q.toplevel.peek_pointers(q.toplevel.shard_for(zone), 10)
        if r.pointer_id == pointer.pointer_id
    ]
    fetcher = consumer.manager.fetcher
    seen: list[Pointer | None] = []
    rules = fetcher.rules(dequeued=lambda v: seen.append(q.toplevel.get_pointer(v.zone)))
    v = ZoneVisit(ref, 1)
    fetcher.visit(consumer.clusters[q.toplevel.cluster], [v], rules, None)
    assert len(v.items) == 1
    assert v.pointer is not None and v.pointer.holder == "worker-7"
    if not one:  # three transactions: handed out before the requeue, the lease still on
        assert seen and seen[0] is not None and seen[0].holder == "worker-7"
    after = q.toplevel.get_pointer(zone)
    assert after is None or (after.lease_id is None and after.holder is None)


def test_a_pointer_leased_before_names_were_recorded_still_reads(q: Quick) -> None:
    """Records written before (no "c" field) decode as before: holder None, and explain
    gives the lease's id as it did."""
    zone = ZoneId("a", "t")
    leased = Pointer("p1", zone, 5_000, 1_000, lease_id="L" * 16)
    old = encode_pointer(leased)
    assert "c" not in msgpack.unpackb(old)
    assert decode_pointer(b"k", old) == leased and decode_pointer(b"k", old).holder is None
    named = Pointer("p1", zone, 5_000, 1_000, lease_id="L" * 16, holder="c1")
    assert decode_pointer(b"k", encode_pointer(named)) == named
    # An unleased pointer records no holder, whatever it was given.
    assert encode_pointer(Pointer("p1", zone, 5_000, 1_000, holder="c1")) == encode_pointer(
        Pointer("p1", zone, 5_000, 1_000)
    )
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    ref = q.toplevel.peek_pointers(q.toplevel.shard_for(q.zone("a", "t")), 10)[0]
    lease = q.toplevel.obtain_pointer_lease(ref, 5_000)  # no holder: as before
    e = explain(q, "a", "t", item)
    assert e.first is not None and e.first.name == "zone_lease"
    assert f"(lease {lease.lease_id[:8]})" in e.first.detail  # type: ignore[index]


@pytest.mark.parametrize("name", ["c1", "3f2a9c0d4b1e7a65", "serve-0123456789ab"])
def test_the_record_grows_only_by_the_name(name: str) -> None:
    """The name's bytes and its field's key and length byte (3 bytes) for the names
    consumers take (under 32 characters)."""
    zone = ZoneId("app", "tenant")
    leased = Pointer("p" * 24, zone, 1_700_000_000_000, 1_700_000_000_000, lease_id="L" * 16)
    named = dataclasses.replace(leased, holder=name)
    grown = len(encode_pointer(named)) - len(encode_pointer(leased))
    assert grown == len(name.encode()) + 3


def test_a_job_types_pool_wide_cap_is_a_rule_with_its_holders(q: Quick) -> None:
    _consumer(q)
    q.job("capped", pool_max_concurrency=2)(lambda payload, ctx: None)
    q.job("free")(lambda payload, ctx: None)
    item = q.enqueue("capped", b"", app="a", tenant="t")
    other = q.enqueue("free", b"", app="a", tenant="t")
    assert _rule(explain(q, "a", "t", item), "type_cap") == [
        "job type 'capped' pool-wide cap 0 of 2 running"
    ]
    # Two consumers' Workers each run one (Slots.acquire of scope "type", as worker.py).
    for holder in ("c1", "c2"):
        assert q.limits.acquire_slots("type", "capped", holder, 1, 2, LEASE_MS) == 1
    e = explain(q, "a", "t", item)
    assert e.first is not None and e.first.name == "type_cap"
    assert e.first.detail == "job type 'capped' pool-wide cap 2 of 2 running"
    assert e.first.consumers == ("c1", "c2")
    assert _rule(explain(q, "a", "t", other), "type_cap") == ["job type 'free': no pool-wide cap"]
    unknown = q.enqueue("elsewhere", b"", app="a", tenant="t")
    assert _rule(explain(q, "a", "t", unknown), "type_cap") == [
        "job type 'elsewhere': no handler in this process"
    ]
    names = [r.name for r in e.rules]
    assert names.index("limit") < names.index("type_cap") < names.index("zone_due")

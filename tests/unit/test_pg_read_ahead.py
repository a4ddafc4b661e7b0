"""A PostgreSQL consumer's visit sends its first reads in one round trip (kv.read_ahead):
every pointer record of a batched visit, and for a zone visited before, what its dequeue
reads first. Before, each was a round trip of its own, one after another: a visit to a
batch of four small zones made eight before it leased anything.

What is read ahead answers the transaction's later reads as storage would (the snapshot's
data), and each later read still adds its read conflicts (the read ahead adds none)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.store.kv import NOT_COMMITTED, KVError, KVStore, read_ahead, reads_ahead
from quickzones.testing.provision.postgres import postgres_skip_reason
from tests.pg_round_trips import RoundTripCounter
from tests.postgres import postgres_store_url

pytestmark = pytest.mark.skipif(
    postgres_skip_reason() is not None, reason=str(postgres_skip_reason())
)

P = b"\x02ahead\x00"  # a prefix of this test's keys
END = P + b"\xff"


def _open(url: str) -> Quick:
    return Quick.open(f"{url}&listen=off")


@pytest.fixture
def kv() -> Iterator[KVStore]:
    q = _open(postgres_store_url())
    store = q.kv
    tr = store.create_transaction()
    for i in range(10):
        tr.set(P + b"k%d" % i, b"v%d" % i)
    tr.set(b"\x02solo\x00", b"one")
    tr.commit()
    try:
        yield store
    finally:
        q.close()


def _change_everything(store: KVStore) -> None:
    """Another transaction, committed: a value changed, one deleted, one added."""
    tr = store.create_transaction()
    tr.set(P + b"k1", b"changed")
    tr.clear(P + b"k2")
    tr.set(P + b"k25", b"new")
    tr.set(b"\x02solo\x00", b"two")
    tr.commit()


def test_reads_after_a_read_ahead_see_the_snapshot(kv: KVStore) -> None:
    tr = kv.create_transaction()
    assert reads_ahead(tr)
    read_ahead(tr, [b"\x02solo\x00", b"\x02absent\x00"], [(P, END, 3), (P + b"k5", END, 20)])
    _change_everything(kv)  # after the snapshot: none of it may show
    assert tr.get(b"\x02solo\x00") == b"one"
    assert tr.get(b"\x02absent\x00") is None
    everything = [(P + b"k%d" % i, b"v%d" % i) for i in range(10)]
    # Inside the first range's three pairs, past them (storage is read for the rest, at
    # the same snapshot), and the second range, held whole.
    assert tr.get_range(P, END, limit=2) == everything[:2]
    assert tr.get_range(P, END, limit=7) == everything[:7]
    assert tr.get_range(P, END) == everything
    assert tr.get_range(P + b"k1", P + b"k4") == everything[1:4]
    assert tr.get_range(P + b"k6", END, limit=2) == everything[6:8]
    assert tr.get_range(P, END, reverse=True, limit=2) == everything[::-1][:2]


def test_a_read_ahead_keeps_what_this_transaction_wrote_on_top(kv: KVStore) -> None:
    tr = kv.create_transaction()
    read_ahead(tr, [], [(P, END, 4)])
    tr.set(P + b"k0", b"mine")
    tr.clear(P + b"k3")
    tr.set(P + b"k05", b"added")
    assert tr.get_range(P, END, limit=4) == [
        (P + b"k0", b"mine"),
        (P + b"k05", b"added"),
        (P + b"k1", b"v1"),
        (P + b"k2", b"v2"),
    ]
    assert tr.get(P + b"k3") is None


def test_a_later_read_still_conflicts(kv: KVStore) -> None:
    """The read ahead answered the range; the read of it still conflicts with a commit
    the snapshot did not see."""
    tr = kv.create_transaction()
    read_ahead(tr, [b"\x02solo\x00"], [(P, END, 3)])
    assert len(tr.get_range(P, END, limit=5)) == 5
    _change_everything(kv)
    tr.set(b"\x02mark\x00", b"x")
    with pytest.raises(KVError) as err:
        tr.commit()
    assert err.value.code == NOT_COMMITTED


def test_a_read_ahead_alone_adds_no_conflict(kv: KVStore) -> None:
    """Read ahead but never read: like a read never made (a visit that did not need it)."""
    tr = kv.create_transaction()
    read_ahead(tr, [b"\x02solo\x00"], [(P, END, 3)])
    _change_everything(kv)
    tr.set(b"\x02mark\x00", b"x")
    tr.commit()


@pytest.fixture(params=["kv", "sql"])
def counted(request: pytest.FixtureRequest) -> Iterator[tuple[Quick, Quick, RoundTripCounter]]:
    """A producer straight to the server and a consumer's Quick through a proxy that
    counts its round trips; zones in the KV layout, or native in SQL (``zones=sql``)."""
    url = postgres_store_url() + ("&zones=sql" if request.param == "sql" else "")
    port = urlsplit(url).port
    assert port is not None
    counter = RoundTripCounter(port)
    producer = _open(url)
    q = _open(url.replace(f":{port}/", f":{counter.port}/"))
    try:
        yield producer, q, counter
    finally:
        q.close()
        producer.close()
        counter.close()


def test_a_visit_reads_known_zones_with_their_pointers(
    counted: tuple[Quick, Quick, RoundTripCounter],
) -> None:
    """Four small zones, visited in one transaction (visits_per_transaction = 4): once
    their zones are known, the visit's reads are one round trip, then its commit. The
    rest of a round: the scans, the completion, the pointers' collection. Before the read
    ahead the same rounds made 26-27 round trips in the KV layout. With ``zones=sql`` the
    visit's pointer locks and dequeue reads go in one round trip, and its leases with its
    commit (a round trip a zone each before: 30 round trips a round)."""
    producer, q, counter = counted
    ran: list[Any] = []

    @q.job("j")
    def j(payload: Any, ctx: Any) -> None:
        ran.append(payload)

    consumer = q.consumer(ConsumerConfig(workers=8))
    trips = []
    for _ in range(3):
        for zone in range(4):
            for i in range(3):
                producer.enqueue("j", {"z": zone, "i": i}, app="a", tenant=f"t{zone}")
        counter.reset()
        assert consumer.run_until_idle() == 12
        trips.append(counter.reset())
    assert len(ran) == 36
    assert max(trips[1:]) <= 20, trips

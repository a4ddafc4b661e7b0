"""Behaviours where the simulator once differed from FoundationDB 7.3.79 (the engine is the
reference), found by integration/fdb/test_differential.py; each runs here on every store
without a cluster, and on the engine through the differential test's regression seeds.
docs/fdb.md lists them."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quickzones.backends.fdb.sim import open_sim_store
from quickzones.backends.memory import MemoryStore
from quickzones.backends.sqlite import SQLiteStore
from quickzones.store.kv import ACCESSED_UNREADABLE, KVError, KVStore, KVTransaction, run

STAMPED = b"p" + b"\x00" * 10 + b"s" + struct.pack("<I", 1)

STORES: dict[str, Callable[[Path], KVStore]] = {
    "memory": lambda tmp: MemoryStore(),
    "sqlite": lambda tmp: SQLiteStore(tmp / "kv.db"),
    "fdbsim": lambda tmp: open_sim_store(root=b"r/"),
}


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    s = STORES[request.param](tmp_path)
    yield s
    s.close()


def _unreadable(fn: Callable[[], object]) -> None:
    with pytest.raises(KVError) as info:
        fn()
    assert info.value.code == ACCESSED_UNREADABLE


def test_a_plain_set_over_a_versionstamped_value_stays_unreadable(store: KVStore) -> None:
    # Engine (seeds 1694, 6998 of the differential test): set after set_versionstamped_value
    # on the same key leaves it unreadable until commit; a clear makes it readable.
    tr = store.create_transaction()
    tr.set_versionstamped_value(b"k", STAMPED)
    tr.set(b"k", b"plain")
    _unreadable(lambda: tr.get(b"k"))
    _unreadable(lambda: tr.get_range(b"", b"\xff"))
    tr.add(b"k", b"\x01")  # an atomic op on top keeps it so
    _unreadable(lambda: tr.get(b"k"))
    tr.clear(b"k")
    assert tr.get(b"k") is None
    tr.set(b"k", b"again")
    assert tr.get(b"k") == b"again"
    tr.commit()
    assert run(store, lambda t: t.get(b"k")) == b"again"


def test_a_limited_range_read_that_stops_short_of_a_stamped_value_reads(store: KVStore) -> None:
    tr = store.create_transaction()
    tr.set(b"a", b"1")
    tr.set(b"z", b"2")
    tr.set_versionstamped_value(b"k", STAMPED)
    assert tr.get_range(b"", b"\xff", limit=1) == [(b"a", b"1")]
    assert tr.get_range(b"", b"\xff", limit=1, reverse=True) == [(b"z", b"2")]
    _unreadable(lambda: tr.get_range(b"", b"\xff", limit=2))
    _unreadable(lambda: tr.get_range(b"b", b"\xff", limit=1))


def test_the_transaction_commits_after_an_unreadable_read(store: KVStore) -> None:
    # libfdb_c fails such a commit with 1036; the seam answers the read itself, so on every
    # store the caller can catch 1036 and go on (the core's idempotent FIFO enqueue does).
    def body(tr: KVTransaction) -> None:
        tr.set_versionstamped_value(b"k", STAMPED)
        _unreadable(lambda: tr.get(b"k"))
        tr.set(b"other", b"x")

    run(store, body)
    assert run(store, lambda t: t.get(b"other")) == b"x"


def test_a_range_read_answered_by_own_writes_takes_no_read_version(store: KVStore) -> None:
    # Engine (seed 5445): the read needs no storage, so the read version is taken at
    # commit, after the other transaction's write: no conflict.
    a = store.create_transaction()
    a.set(b"d", b"mine")
    assert a.get_range(b"d", b"e", limit=1, snapshot=True) == [(b"d", b"mine")]
    a.add_read_conflict_range(b"x", b"y")
    run(store, lambda t: t.set(b"x", b"theirs"))
    a.commit()
    assert run(store, lambda t: t.get(b"d")) == b"mine"


def test_an_inverted_clear_range_is_refused_at_the_call(store: KVStore) -> None:
    # Engine (seeds 33, 148): libfdb_c takes it and fails the next read and the commit with
    # 2005; the seam refuses it at the call on every store and the transaction goes on.
    def body(tr: KVTransaction) -> None:
        with pytest.raises(KVError) as info:
            tr.clear_range(b"d", b"b")
        assert info.value.code == 2005
        tr.set(b"after", b"x")
        assert tr.get(b"after") == b"x"

    run(store, body)
    assert run(store, lambda t: t.get(b"after")) == b"x"


def test_an_inverted_conflict_range_is_refused_at_the_call(store: KVStore) -> None:
    # Engine (seeds 79, 164, 171): 2005 at the call, for read and write conflict ranges.
    tr = store.create_transaction()
    for add in (tr.add_read_conflict_range, tr.add_write_conflict_range):
        with pytest.raises(KVError) as info:
            add(b"d", b"b")
        assert info.value.code == 2005
    tr.add_read_conflict_range(b"b", b"b")  # empty is fine
    tr.set(b"k", b"v")
    tr.commit()

"""Batched reads (issue 14, fdb:// throughput): ``quickzones.store.kv.get_many`` answers like one
``get`` per key, read conflicts included, on every store; FoundationDB sends the reads at
once. A visit of many items reads them through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.errors import KVError
from quickzones.store.kv import get_many, prefetch, run
from tests.conftest import store_url


@pytest.fixture
def quick(backend: str, tmp_path: Path) -> Quick:
    return Quick.open(store_url(backend, tmp_path))


def test_get_many_answers_each_key_in_order(quick: Quick) -> None:
    kv = quick.kv
    assert kv is not None

    def write(tr: object) -> None:
        tr.set(b"gm/a", b"1")  # type: ignore[attr-defined]
        tr.set(b"gm/c", b"3")  # type: ignore[attr-defined]

    run(kv, write)
    got = run(kv, lambda tr: get_many(tr, [b"gm/c", b"gm/b", b"gm/a", b"gm/c"]))
    assert got == [b"3", None, b"1", b"3"]
    assert run(kv, lambda tr: get_many(tr, [])) == []
    quick.close()


def test_a_key_read_by_get_many_conflicts_like_get(quick: Quick) -> None:
    kv = quick.kv
    assert kv is not None
    run(kv, lambda tr: tr.set(b"gm/k", b"0"))
    for read in (get_many, prefetch):
        tr = kv.create_transaction()
        if read is prefetch and not hasattr(tr, "get_many"):
            continue  # a local store's prefetch reads nothing (its reads cost nothing)
        read(tr, [b"gm/k"])
        run(kv, lambda t: t.set(b"gm/k", b"changed"))  # a concurrent writer commits first
        tr.set(b"gm/other", b"x")
        with pytest.raises(KVError):
            tr.commit()
    quick.close()


def test_a_big_visit_takes_every_item_it_read(quick: Quick) -> None:
    quick.job("job")(lambda payload, ctx: None)
    ids = quick.enqueue_many("job", [b""] * 300, app="app", tenant="t")
    from quickzones.consumer import ConsumerConfig
    from quickzones.store.records import ZoneId

    consumer = quick.consumer(ConsumerConfig(in_order=True, dequeue_max=300, processing_bound=300))
    [ref] = consumer.scan_once()
    works = consumer.visit(ref)
    assert sorted(w.item.item_id for w in works) == sorted(ids)
    for w in works:
        consumer.execute(w)
    assert quick.zones.count(ZoneId("app", "t")) == 0
    quick.close()


def _mixed_writes(tr: Any) -> None:
    tr.set(b"gm/new", b"n")  # written here, not stored
    tr.clear(b"gm/a")  # stored, cleared here
    tr.clear_range(b"gm/r0", b"gm/r9")  # stored keys cleared by a range
    tr.add(b"gm/n", (5).to_bytes(8, "little"))  # a pending atomic op on a stored value


MIXED = [b"gm/c", b"gm/new", b"gm/a", b"gm/r1", b"gm/n", b"gm/none", b"gm/c", b"x" * 20_000]


def test_get_many_answers_as_get_does_after_this_transactions_own_writes(quick: Quick) -> None:
    """Stores that read many keys in one statement (SQLite) answer each key exactly as
    ``get`` would: this transaction's sets, clears, range clears and atomic ops first,
    missing and over-long keys as None, repeats repeated."""
    kv = quick.kv
    assert kv is not None

    def stored(tr: Any) -> None:
        for key in (b"gm/a", b"gm/c", b"gm/r1", b"gm/r2"):
            tr.set(key, key + b"!")
        tr.set(b"gm/n", (1).to_bytes(8, "little"))

    run(kv, stored)

    def read(how: Any) -> list[bytes | None]:
        tr = kv.create_transaction()  # never committed: both see the same stored state
        try:
            _mixed_writes(tr)
            return list(how(tr))
        finally:
            tr.cancel()

    expected = read(lambda tr: [tr.get(k) for k in MIXED])
    assert expected[:6] == [b"gm/c!", b"n", None, None, (6).to_bytes(8, "little"), None]
    assert read(lambda tr: get_many(tr, MIXED)) == expected
    quick.close()


def test_get_many_refuses_a_system_key_as_get_does(quick: Quick) -> None:
    kv = quick.kv
    assert kv is not None
    tr = kv.create_transaction()
    with pytest.raises(KVError) as by_get:
        tr.get(b"\xff/x")
    with pytest.raises(KVError) as by_many:
        get_many(tr, [b"gm/a", b"\xff/x"])
    assert by_many.value.code == by_get.value.code
    tr.cancel()
    quick.close()


def test_get_many_of_more_keys_than_one_statement_takes(quick: Quick) -> None:
    """A batch larger than one SQL statement's parameters (SQLite reads 500 a statement)
    answers every key, in order, repeats included."""
    kv = quick.kv
    assert kv is not None
    keys = [b"gm/many/%05d" % n for n in range(1_200)]

    def stored(tr: Any) -> None:
        for key in keys[::3]:
            tr.set(key, key[-5:])

    run(kv, stored)
    wanted = [*reversed(keys), keys[0], b"gm/absent"]
    got = run(kv, lambda tr: get_many(tr, wanted))
    assert got == [key[-5:] if int(key[-5:]) % 3 == 0 else None for key in wanted[:-1]] + [None]
    quick.close()

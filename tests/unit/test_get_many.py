"""Batched reads (issue 14, fdb:// throughput): ``quickzones.kv.get_many`` answers like one
``get`` per key, read conflicts included, on every store; FoundationDB sends the reads at
once. A visit of many items reads them through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.errors import KVError
from quickzones.kv import get_many, prefetch, run
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
    from quickzones.records import ZoneId

    consumer = quick.consumer(ConsumerConfig(in_order=True, dequeue_max=300, processing_bound=300))
    [ref] = consumer.scan_once()
    works = consumer.visit(ref)
    assert sorted(w.item.item_id for w in works) == sorted(ids)
    for w in works:
        consumer.execute(w)
    assert quick.zones.count(ZoneId("app", "t")) == 0
    quick.close()

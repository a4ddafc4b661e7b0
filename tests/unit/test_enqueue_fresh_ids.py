"""An enqueue whose id quick generates reads no item record in its first attempt (nothing
can be stored under an id made a moment ago), and still stores each item once when an
attempt's commit is retried after ``commit_unknown_result``; a caller's id is always
checked, so an enqueue with a queued id stays a no-op."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from quickzones.backends.memory import MemoryStore
from quickzones.backends.memory.faults import FaultConfig
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from quickzones.store.validation import check_name
from tests.conftest import store_url

Z = ZoneId("app", "t1")


def count_item_reads(q: Quick) -> list[bytes]:
    """From now on, every item-record key ``q``'s transactions read (get or get_many) is
    appended to the returned list."""
    reads: list[bytes] = []
    items_prefix = q.keys.item_key(Z, "")[:-2]
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        tr = real()
        get = tr.get

        def counted_get(key: bytes, *, snapshot: bool = False) -> bytes | None:
            if key.startswith(items_prefix) and key != q.keys.count_key(Z):
                reads.append(key)
            return get(key, snapshot=snapshot)

        tr.get = counted_get  # type: ignore[method-assign]
        many = getattr(tr, "get_many", None)
        if many is not None:

            def counted_many(keys: list[bytes], **kw: bool) -> list[bytes | None]:
                reads.extend(k for k in keys if k.startswith(items_prefix))
                return many(keys, **kw)  # type: ignore[no-any-return]

            tr.get_many = counted_many  # type: ignore[attr-defined]
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return reads


def record_keys(q: Quick, ids: list[str]) -> set[bytes]:
    return {q.keys.item_key(Z, i) for i in ids}


@pytest.mark.parametrize("backend", ["memory", "sqlite", "fdbsim"])
def test_a_generated_id_is_not_read_but_a_chosen_one_is(backend: str, tmp_path: Path) -> None:
    q = Quick.open(store_url(backend, tmp_path), clock=ManualClock())
    reads = count_item_reads(q)
    one = q.enqueue("job", b"x", app=Z.app, tenant=Z.tenant)
    many = q.enqueue_many("job", [b"a", b"b", b"c"], app=Z.app, tenant=Z.tenant)
    assert not set(reads) & record_keys(q, [one, *many])
    mine = q.enqueue("job", b"x", app=Z.app, tenant=Z.tenant, item_id="order-1")
    again = q.enqueue("job", b"x", app=Z.app, tenant=Z.tenant, item_id="order-1")
    assert q.keys.item_key(Z, "order-1") in reads
    assert (mine, again.duplicate) == ("order-1", "queued")  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 5


EnqueueAll = Callable[[Quick], list[str]]


def _singly(q: Quick) -> list[str]:
    return [q.enqueue("job", n, app=Z.app, tenant=Z.tenant) for n in range(40)]


def _batches(q: Quick) -> list[str]:
    return [
        i for b in range(8) for i in q.enqueue_many("job", range(5), app=Z.app, tenant=Z.tenant)
    ]


@pytest.mark.parametrize("enqueue_all", [_singly, _batches], ids=["enqueue", "enqueue_many"])
def test_unknown_result_retries_store_each_generated_id_once(enqueue_all: EnqueueAll) -> None:
    clock = ManualClock()
    # Half the commits apply and then report commit_unknown_result: the retry must find
    # what the first attempt wrote instead of counting and indexing the item again.
    faults = FaultConfig(unknown_result=0.5, unknown_result_applied=1.0)
    q = Quick(MemoryStore(seed=11, clock=clock, faults=faults), clock=clock)
    ids = enqueue_all(q)
    assert q.kv.fault_counts["unknown_result_applied"] > 0  # type: ignore[attr-defined]
    q.kv.faults = FaultConfig()  # type: ignore[attr-defined]
    assert len(set(ids)) == 40
    assert q.zones.count(Z) == 40
    assert sorted(i.item_id for i in q.zones.peek(Z, 100)) == sorted(ids)
    order = q.kv.create_transaction().get_range(*q.keys.order_range(Z))
    assert len(order) == 40  # one order entry per item


def test_ascii_names_take_the_fast_check_and_others_the_full_one() -> None:
    assert check_name("tenant", "acme-42 (eu)") == "acme-42 (eu)"
    assert check_name("tenant", "café") == "café"
    for bad in ("a\nb", "a\x7fb", "a\x85b", "a\u2028b"):
        with pytest.raises(Exception, match="tenant"):
            check_name("tenant", bad)


def test_an_item_id_makes_an_enqueue_in_a_retried_caller_transaction_store_once() -> None:
    """docs/guarantees.md: inside the caller's transaction, retried after unknown
    results, an enqueue with an id from the caller's data is stored once."""
    clock = ManualClock()
    faults = FaultConfig(unknown_result=0.5, unknown_result_applied=1.0)
    q = Quick(MemoryStore(seed=5, clock=clock, faults=faults), clock=clock)
    for n in range(20):

        def order(tr: KVTransaction, n: int = n) -> None:
            tr.set(b"orders/%d" % n, b"paid")
            q.enqueue("job", n, app=Z.app, tenant=Z.tenant, item_id=f"order-{n}", tr=tr)

        q.transact(order)
    assert q.kv.fault_counts["unknown_result_applied"] > 0  # type: ignore[attr-defined]
    q.kv.faults = FaultConfig()  # type: ignore[attr-defined]
    assert q.zones.count(Z) == 20
    assert sorted(i.item_id for i in q.zones.peek(Z, 100)) == sorted(
        f"order-{n}" for n in range(20)
    )

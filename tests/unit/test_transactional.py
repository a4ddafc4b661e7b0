"""``quickzones.store.kv.transactional``: one spelling per operation, as ``@fdb.transactional``.

A decorated function takes its transaction as the keyword ``tr``: given a store it opens a
transaction, retries through ``run()`` and commits; given a transaction it runs inside it
and commits nothing, so operations compose into the caller's one atomic commit. On a
method, leaving ``tr`` out means the object's own store (``self.kv``)."""

from __future__ import annotations

import inspect

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ItemNotFound
from quickzones.store.kv import OWN_STORE, KVStore, KVTransaction, run, transactional
from quickzones.store.records import ZoneId
from quickzones.store.zones import KVZoneStore as ZoneOps
from quickzones.urls import open_kv

Z = ZoneId("a", "t")


@transactional
def put(key: bytes, value: bytes, *, tr: KVTransaction = OWN_STORE) -> int:
    tr.set(key, value)
    return len(value)


@transactional
def get(key: bytes, *, tr: KVTransaction = OWN_STORE) -> bytes | None:
    return tr.get(key)


class Box:
    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    @transactional
    def swap(self, a: bytes, b: bytes, *, tr: KVTransaction = OWN_STORE) -> None:
        va, vb = tr.get(a), tr.get(b)
        tr.set(a, vb or b"")
        tr.set(b, va or b"")


@pytest.fixture
def store() -> KVStore:
    return open_kv("memory://")


def test_given_a_store_it_commits(store: KVStore) -> None:
    assert put(b"k", b"v", tr=store) == 1
    assert get(b"k", tr=store) == b"v"


def test_given_a_transaction_it_joins_and_commits_nothing(store: KVStore) -> None:
    class Abort(Exception):
        pass

    def body(tr: KVTransaction) -> None:
        put(b"k", b"v", tr=tr)
        assert get(b"k", tr=tr) == b"v"  # the caller's transaction sees its own write
        raise Abort

    with pytest.raises(Abort):
        run(store, body)
    assert get(b"k", tr=store) is None  # nothing committed on its own


def test_it_retries_a_conflict(store: KVStore) -> None:
    attempts: list[int] = []

    @transactional
    def bump(*, tr: KVTransaction = OWN_STORE) -> None:
        attempts.append(1)
        tr.get(b"n")
        if len(attempts) == 1:
            put(b"n", b"other", tr=store)  # a concurrent commit on what this read
        tr.set(b"n", b"mine")

    bump(tr=store)
    assert len(attempts) == 2 and get(b"n", tr=store) == b"mine"


def test_a_method_without_tr_uses_its_own_store(store: KVStore) -> None:
    put(b"a", b"1", tr=store)
    box = Box(store)
    box.swap(b"a", b"b")
    assert (get(b"a", tr=store), get(b"b", tr=store)) == (b"", b"1")


def test_a_function_without_a_store_says_so() -> None:
    with pytest.raises(TypeError, match=r"put\(\) needs tr="):
        put(b"k", b"v")


def test_only_a_keyword_only_tr_can_be_decorated() -> None:
    with pytest.raises(TypeError, match="keyword-only parameter 'tr'"):

        @transactional
        def old_style(tr: KVTransaction, key: bytes) -> None: ...


def test_the_decorated_signature_is_the_functions() -> None:
    assert list(inspect.signature(put).parameters) == ["key", "value", "tr"]


# --- the zone operations: one spelling each ------------------------------------------------


def test_zone_operations_have_no_in_twins() -> None:
    # x_in(tr, ...) / x(...) pairs are one operation each now.
    twins = [n for n in vars(ZoneOps) if n.endswith("_in") and not n.startswith("_")]
    assert twins == []


def test_complete_joins_the_callers_transaction() -> None:
    q = Quick.open("memory://", clock=ManualClock())
    item_id = q.enqueue("job", b"x", app="a", tenant="t")

    class Abort(Exception):
        pass

    def body(tr: KVTransaction) -> None:
        q.zones.complete(Z, item_id, tr=tr)
        tr.set(b"user/row", b"1")
        raise Abort

    with pytest.raises(Abort):
        run(q.kv, body)
    assert q.zones.get(Z, item_id) is not None  # neither the completion nor the row
    q.zones.complete(Z, item_id)  # on its own store, in its own transaction
    assert q.zones.get(Z, item_id) is None
    with pytest.raises(ItemNotFound):
        q.zones.complete(Z, item_id)


def test_min_vesting_in_or_out_of_a_transaction_agree() -> None:
    q = Quick.open("memory://", clock=ManualClock())
    q.enqueue("job", b"x", app="a", tenant="t", delay=5)
    alone = q.zones.min_vesting_ms(Z)
    assert alone is not None
    assert run(q.kv, lambda tr: q.zones.min_vesting_ms(Z, tr=tr)) == alone


def test_dead_letter_read_and_take_in_one_transaction() -> None:
    q = Quick.open("memory://", clock=ManualClock())
    item_id = q.enqueue("job", b"x", app="a", tenant="t")
    q.zones.dead_letter(Z, item_id, None, "operator")
    letter = q.zones.read_dead_letter(Z, item_id)
    assert letter is not None and letter.reason == "operator"

    def take(tr: KVTransaction) -> str:
        assert q.zones.read_dead_letter(Z, item_id, tr=tr) is not None
        return q.zones.take_dead_letter(Z, item_id, tr=tr).item_id

    assert run(q.kv, take) == item_id
    assert q.zones.read_dead_letter(Z, item_id) is None

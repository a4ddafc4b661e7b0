"""``kv.prefetch_range``: a transaction that read a small range ahead answers its later
reads inside it from what it read, exactly as storage would (the same snapshot), and
each of those reads still adds its read conflicts. Every backend: where a transaction
cannot prefetch (FoundationDB) the call does nothing and the reads are plain."""

from __future__ import annotations

import pytest

from quickzones.errors import InvalidArgument
from quickzones.store.kv import KVError, KVStore, KVTransaction, prefetch_range, read_ahead, run

P = b"pf/"


def _fill(store: KVStore) -> None:
    def write(tr: KVTransaction) -> None:
        for i in range(6):
            tr.set(P + b"%02d" % i, b"v%d" % i)
        tr.set(b"pg/outside", b"x")

    run(store, write)


def _reads(tr: KVTransaction) -> list[object]:
    tr.set(P + b"03", b"local")  # read-your-writes over what was fetched
    tr.clear(P + b"01")
    return [
        tr.get(P + b"02"),
        tr.get(P + b"01"),
        tr.get(P + b"09"),
        tr.get_range(P, P + b"\xff"),
        tr.get_range(P, P + b"\xff", limit=2),
        tr.get_range(P, P + b"\xff", limit=2, reverse=True),
        tr.get_range(P + b"02", P + b"05", reverse=True),
        tr.get_range(P + b"04", b"ph"),  # runs past the fetched range
        tr.get(b"pg/outside"),
    ]


def test_reads_after_a_prefetch_are_the_reads_without_it(kv_store: KVStore) -> None:
    _fill(kv_store)
    plain = kv_store.create_transaction()
    ahead = kv_store.create_transaction()
    prefetch_range(ahead, P, P + b"\xff", 32)
    assert _reads(ahead) == _reads(plain)


def test_a_range_too_big_to_keep_reads_as_without_it(kv_store: KVStore) -> None:
    _fill(kv_store)
    plain = kv_store.create_transaction()
    ahead = kv_store.create_transaction()
    prefetch_range(ahead, P, P + b"\xff", 3)  # 6 keys: nothing kept
    assert _reads(ahead) == _reads(plain)


def test_the_prefetch_says_whether_it_kept_the_range(kv_store: KVStore) -> None:
    """True when kept, False when too big (a zone store then skips its next prefetches
    of that zone), None where the backend does not prefetch."""
    _fill(kv_store)
    tr = kv_store.create_transaction()
    if getattr(tr, "prefetch_range", None) is None:
        assert prefetch_range(tr, P, P + b"\xff", 32) is None
        return
    assert prefetch_range(tr, P, P + b"\xff", 32) is True
    assert prefetch_range(kv_store.create_transaction(), P, P + b"\xff", 3) is False


# The two ways a transaction reads ahead, each of P's pairs (and, for kv.read_ahead, one
# key outside it): the reads after either keep their conflicts, and either alone adds none.
AHEAD = {
    "prefetch_range": lambda tr: prefetch_range(tr, P, P + b"\xff", 32),
    "read_ahead": lambda tr: read_ahead(tr, [b"pg/outside"], [(P, P + b"\xff", 3)]),
}


@pytest.mark.parametrize("ahead", sorted(AHEAD))
def test_reads_answered_from_what_was_read_ahead_still_conflict(
    kv_store: KVStore, ahead: str
) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    AHEAD[ahead](reader)
    assert reader.get_range(P + b"02", P + b"04") == [(P + b"02", b"v2"), (P + b"03", b"v3")]
    run(kv_store, lambda tr: tr.set(P + b"03", b"changed"))
    reader.set(b"pg/mark", b"1")
    with pytest.raises(KVError) as err:
        reader.commit()
    assert err.value.code == 1020


@pytest.mark.parametrize("ahead", sorted(AHEAD))
def test_reading_ahead_itself_adds_no_conflict(kv_store: KVStore, ahead: str) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    AHEAD[ahead](reader)
    assert reader.get(P + b"00") == b"v0"
    run(kv_store, lambda tr: tr.set(P + b"05", b"changed"))  # fetched or not, never read
    run(kv_store, lambda tr: tr.set(b"pg/outside", b"changed"))
    reader.set(b"pg/mark", b"1")
    reader.commit()


def test_a_limit_below_one_is_refused(kv_store: KVStore) -> None:
    tr = kv_store.create_transaction()
    ahead = getattr(tr, "prefetch_range", None)
    if ahead is None:
        pytest.skip("this backend's transactions do not prefetch")
    with pytest.raises(InvalidArgument):
        ahead(P, P + b"\xff", 0)

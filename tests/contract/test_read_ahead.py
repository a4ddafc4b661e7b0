"""``kv.read_ahead``: a transaction that read some keys and the first pairs of some ranges
ahead, in one round trip, answers its later reads inside them from what it read, exactly
as storage would (the same snapshot), reads storage past them, and each later read still
adds its read conflicts. Every backend: where a transaction cannot read ahead (SQLite,
FoundationDB, the simulator) the call does nothing and the reads are plain."""

from __future__ import annotations

import pytest

from quickzones.store.kv import KVError, KVStore, KVTransaction, read_ahead, reads_ahead, run

P = b"ra/"
END = P + b"\xff"


def _fill(store: KVStore) -> None:
    def write(tr: KVTransaction) -> None:
        for i in range(8):
            tr.set(P + b"%02d" % i, b"v%d" % i)
        tr.set(b"rb/outside", b"x")

    run(store, write)


def _reads(tr: KVTransaction) -> list[object]:
    tr.set(P + b"03", b"local")  # read-your-writes over what was fetched
    tr.clear(P + b"01")
    return [
        tr.get(b"rb/outside"),
        tr.get(b"rb/absent"),
        tr.get(P + b"02"),
        tr.get_range(P, END, limit=2),  # inside the first pairs read ahead
        tr.get_range(P, END, limit=6),  # past them: storage at the same snapshot
        tr.get_range(P, END),
        tr.get_range(P + b"02", P + b"05"),
        tr.get_range(P, END, limit=2, reverse=True),
        tr.get_range(P + b"05", b"rc"),  # runs past the second range's end
    ]


@pytest.mark.parametrize(
    "ranges",
    [
        [(P, END, 3)],  # the first three pairs of eight
        [(P, END, 20)],  # all of it
        [(P, END, 3), (P + b"04", P + b"06", 1)],  # two, one inside the other's span
    ],
)
def test_reads_after_a_read_ahead_are_the_reads_without_it(
    kv_store: KVStore, ranges: list[tuple[bytes, bytes, int]]
) -> None:
    _fill(kv_store)
    plain = kv_store.create_transaction()
    ahead = kv_store.create_transaction()
    read_ahead(ahead, [b"rb/outside", b"rb/absent"], ranges)
    assert _reads(ahead) == _reads(plain)


def test_reads_answered_from_a_read_ahead_see_its_snapshot(kv_store: KVStore) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    read_ahead(reader, [b"rb/outside"], [(P, END, 3)])
    if not reads_ahead(reader):
        reader.get(b"rb/outside")  # a plain transaction's snapshot starts at its first read
    run(kv_store, lambda tr: tr.set(P + b"01", b"changed"))
    assert reader.get_range(P, END, limit=4) == [(P + b"%02d" % i, b"v%d" % i) for i in range(4)]


def test_reads_answered_from_a_read_ahead_still_conflict(kv_store: KVStore) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    read_ahead(reader, [b"rb/outside"], [(P, END, 3)])
    assert reader.get_range(P, END, limit=2) == [(P + b"00", b"v0"), (P + b"01", b"v1")]
    run(kv_store, lambda tr: tr.set(P + b"01", b"changed"))
    reader.set(b"rb/mark", b"1")
    with pytest.raises(KVError) as err:
        reader.commit()
    assert err.value.code == 1020


def test_the_read_ahead_itself_adds_no_conflict(kv_store: KVStore) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    read_ahead(reader, [b"rb/outside"], [(P, END, 3)])
    assert reader.get(P + b"00") == b"v0"
    run(kv_store, lambda tr: tr.set(P + b"02", b"changed"))  # fetched, never read
    run(kv_store, lambda tr: tr.set(b"rb/outside", b"changed"))
    reader.set(b"rb/mark", b"1")
    reader.commit()

"""``kv.read_ahead``: a transaction that read some keys and the first pairs of some ranges
ahead, in one round trip, answers its later reads inside them from what it read, exactly
as storage would (the same snapshot), reads storage past them, and each later read still
adds its read conflicts (test_prefetch_range.py checks the conflicts of both ways of
reading ahead). Every backend: where a transaction cannot read ahead (SQLite,
FoundationDB, the simulator) the call does nothing and the reads are plain."""

from __future__ import annotations

import pytest

from quickzones.store.kv import KVStore, KVTransaction, read_ahead, reads_ahead, run
from tests.contract.test_prefetch_range import P, _fill, _reads

# The keys and reads of the prefetch's contract test: six pairs under P, one outside.
END = P + b"\xff"
OUTSIDE = b"pg/outside"


def _reads_past(tr: KVTransaction) -> list[object]:
    """The prefetch test's reads, and two that stop past a kept prefix of three."""
    return [*_reads(tr), tr.get_range(P, END, limit=4), tr.get(b"pg/absent")]


@pytest.mark.parametrize(
    "ranges",
    [
        [(P, END, 3)],  # the first three pairs of six
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
    read_ahead(ahead, [OUTSIDE, b"pg/absent"], ranges)
    assert _reads_past(ahead) == _reads_past(plain)


def test_reads_answered_from_a_read_ahead_see_its_snapshot(kv_store: KVStore) -> None:
    _fill(kv_store)
    reader = kv_store.create_transaction()
    read_ahead(reader, [OUTSIDE], [(P, END, 3)])
    if not reads_ahead(reader):
        reader.get(OUTSIDE)  # a plain transaction's snapshot starts at its first read
    run(kv_store, lambda tr: tr.set(P + b"01", b"changed"))
    assert reader.get_range(P, END, limit=4) == [(P + b"%02d" % i, b"v%d" % i) for i in range(4)]

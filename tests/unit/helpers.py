"""Helpers shared by the unit tests."""

from __future__ import annotations

from quickzones.client import Quick
from quickzones.store.kv import KVTransaction


def count_range_rows(q: Quick) -> list[int]:
    """From now on, every range read of ``q``'s store appends the rows it returned to the
    list returned here: what a zone operation read, whatever the backend."""
    reads: list[int] = []
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        tr = real()
        orig = tr.get_range

        def get_range(*a: object, **k: object) -> list[tuple[bytes, bytes]]:
            rows = orig(*a, **k)  # type: ignore[arg-type]
            reads.append(len(rows))
            return rows

        tr.get_range = get_range  # type: ignore[method-assign]
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return reads

"""Dead letters grouped by job type and error (issue 45 point 4), counted with the data:
the transaction that writes a dead letter adds one to its group, the one that requeues or
purges it takes one away, so the dashboard shows each group's size without reading a
letter::

    (root, "m", "dead-groups", app, job_type, error) -> i64 (atomic add)

A letter's group is its job type (``""`` for a corrupt record) and :func:`error_of` its
reason: the first line, numbers and hex ids replaced by ``#`` and cut to
:data:`ERROR_CHARS`, so "order 1234 not found" and "order 98 not found" are one group and
the groups stay few however many distinct messages failures carry. A group whose count
fell to zero keeps its key (one per group ever seen); pages pass over it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quickzones.errors import InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64
from quickzones.store.pages import Page, decode_cursor, encode_cursor
from quickzones.store.records import DeadLetter

_NAME = "dead-groups"
ERROR_CHARS = 80
_ARITY = 2  # a cursor names (job_type, error) below (root, "m", "dead-groups", app)
_NUMBERS = re.compile(r"\b(?:0x)?[0-9a-f]*[0-9][0-9a-f]*\b", re.IGNORECASE)
# Keys a page passes over (groups emptied by requeues and purges) before it ends short.
_SKIP = 1000


def error_of(reason: str) -> str:
    """The error part of a group: ``reason``'s first line with numbers and ids as ``#``."""
    first = reason.strip().split("\n", 1)[0]
    return _NUMBERS.sub("#", first)[:ERROR_CHARS]


def group_of(job_type: str | None, reason: str) -> tuple[str, str]:
    return (job_type or "", error_of(reason))


def letter_group(letter: DeadLetter) -> tuple[str, str]:
    return group_of(None if letter.item is None else letter.item.job_type, letter.reason)


def add(tr: KVTransaction, keys: KeySpace, app: str, group: tuple[str, str], n: int) -> None:
    """Add ``n`` (negative: take away) to a group's count, in ``tr`` (an atomic add)."""
    tr.add(keys.meta_key(_NAME, app, *group), pack_i64(n))


@dataclass(frozen=True, slots=True)
class Group:
    job_type: str  # "" for corrupt records
    error: str
    count: int


def group_page(
    kv: KVStore, keys: KeySpace, app: str, *, limit: int = 50, cursor: str | None = None
) -> Page[Group]:
    """One page of ``app``'s dead-letter groups in (job type, error) order, from
    ``cursor``; empty groups are passed over (at most ``_SKIP`` a page)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument("limit", limit, "must be a whole number of at least 1")
    begin, end = keys.meta_range(_NAME, app)
    base = begin[:-1]
    start = begin if cursor is None else decode_cursor(base, cursor, _ARITY) + b"\x00"
    shown: list[tuple[bytes, Group]] = []
    passed = 0
    while True:
        batch = limit + 1 - len(shown)

        def read(tr: KVTransaction, s: bytes = start, n: int = batch) -> list[tuple[bytes, bytes]]:
            return tr.get_range(s, end, limit=n, snapshot=True)

        rows = run(kv, read)
        for key, value in rows:
            start = key + b"\x00"
            count = unpack_i64(value)
            if count <= 0:
                passed += 1
                continue
            *_, job_type, error = keys.unpack(key)
            shown.append((key, Group(str(job_type), str(error), count)))
            if len(shown) > limit:
                return Page([g for _, g in shown[:limit]], encode_cursor(base, shown[limit - 1][0]))
        if len(rows) < batch:
            return Page([g for _, g in shown], None)
        if passed >= _SKIP:
            return Page([g for _, g in shown], encode_cursor(base, rows[-1][0]))


def group_count(kv: KVStore, keys: KeySpace, app: str, group: tuple[str, str]) -> int:
    """How many dead letters one group holds (one key read)."""

    def read(tr: KVTransaction) -> bytes | None:
        return tr.get(keys.meta_key(_NAME, app, *group), snapshot=True)

    return max(0, unpack_i64(run(kv, read)))

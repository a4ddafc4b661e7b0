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

Beside the groups, each app's total, so its count is one key read however many groups
there are (an error text with a name in it makes a group per name)::

    (root, "m", "dead-total", app) -> i64 (atomic add)

A store written before these counters existed has letters no counter saw (and, from the
versions that kept groups but no total, group counts of only the later ones). So the
counters of an app count only the letters whose key lies below its *counted boundary*::

    (root, "m", "dead-counted", app) -> the key up to which its letters are counted

absent (nothing counted yet) until the app's first letter is written (it has no letters
to backfill: the boundary goes to the end, and every letter counts from then on) or,
for a store with letters no counter saw, a backfill (:func:`advance`) starts: its first step
clears the app's counters, and each step counts the next :data:`BACKFILL_KEYS` keys of the
app's letters and moves the boundary past them, in one transaction; the boundary at the
end of the app's letter range means every letter is counted. A write of a letter (or its
requeue or purge) reads the boundary with a conflict and counts itself only below it: a
step that reads a range a writer wrote in, or a writer that read the boundary a step
moved, retries, so each letter is counted once. Dead-letter writes are rare: the one
extra read is paid only by them, and once the boundary is at the end nothing writes it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from quickzones.errors import CorruptRecord, InvalidArgument
from quickzones.store.keys import KeySpace
from quickzones.store.kv import KVStore, KVTransaction, pack_i64, run, unpack_i64
from quickzones.store.pages import Page, decode_cursor, encode_cursor
from quickzones.store.records import (
    DeadLetter,
    ZoneId,
    dead_letter_chunks,
    decode_dead_letter,
)

_NAME = "dead-groups"
_TOTAL = "dead-total"
_COUNTED = "dead-counted"
# Keys of an app's letters one backfill step reads (one transaction, well inside 5 s).
BACKFILL_KEYS = 1000
CORRUPT = "corrupt dead letter record"  # the group of a letter whose record is unreadable
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


def add(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item_id: str, group: tuple[str, str], n: int
) -> None:
    """Add ``n`` (negative: take away) to the count of the letter ``item_id``'s group and
    its app's total, in ``tr`` (atomic adds), if the backfill has counted that far (a read
    of the app's boundary, with a conflict: see the module's docstring)."""
    mark = keys.meta_key(_COUNTED, zone.app)
    boundary = tr.get(mark)
    if boundary is None and n > 0:
        boundary = _count_from_birth(tr, keys, zone.app)
    if boundary is None or keys.dead_letter_key(zone, item_id) >= boundary:
        return  # the backfill counts it when it gets there
    tr.add(keys.meta_key(_NAME, zone.app, *group), pack_i64(n))
    tr.add(keys.meta_key(_TOTAL, zone.app), pack_i64(n))


def _count_from_birth(tr: KVTransaction, keys: KeySpace, app: str) -> bytes | None:
    """The first letter of an app with none (a new app, or one whose letters are all
    gone): nothing is left to backfill, so its counters count from here, every letter
    (the boundary at the end of its range, any stale count cleared). Read with a conflict
    on the app's letters, once an app: a letter written meanwhile retries one of them."""
    begin, end = keys.dead_letters_range(app)
    if tr.get_range(begin, end, limit=1):
        return None  # letters no counter saw: the backfill counts them
    tr.clear_range(*keys.meta_range(_NAME, app))
    tr.clear(keys.meta_key(_TOTAL, app))
    tr.set(keys.meta_key(_COUNTED, app), end)
    return end


@dataclass(frozen=True, slots=True)
class Total:
    count: int  # the app's dead letters counted so far
    exact: bool  # every letter counted (the backfill is done): ``count`` is the count


def total(kv: KVStore, keys: KeySpace, app: str, *, steps: int = 1) -> Total:
    """How many dead letters ``app`` has (two key reads; an app none was ever counted in,
    a third: has it any?), first advancing its counters' backfill by at most ``steps``
    steps (:func:`advance`) if it has not finished; until then ``count`` is of the
    letters counted so far, at most the true count."""
    for _ in range(steps):
        if advance(kv, keys, app):
            break

    def read(tr: KVTransaction) -> Total:
        count = tr.get(keys.meta_key(_TOTAL, app), snapshot=True)
        boundary = tr.get(keys.meta_key(_COUNTED, app), snapshot=True)
        if boundary is None:  # no letter counted yet: exact if it has none at all
            letters = tr.get_range(*keys.dead_letters_range(app), limit=1, snapshot=True)
            return Total(0, not letters)
        return Total(max(0, unpack_i64(count)), _done(keys, app, boundary))

    return run(kv, read)


def _done(keys: KeySpace, app: str, boundary: bytes | None) -> bool:
    return boundary is not None and boundary >= keys.dead_letters_range(app)[1]


def advance(kv: KVStore, keys: KeySpace, app: str, *, max_keys: int = BACKFILL_KEYS) -> bool:
    """One backfill step of ``app``'s counters: count the letters in the next
    ``max_keys`` keys past the boundary and move it past them, in one
    transaction (the first step clears counts a store written before the boundary
    existed may hold). Returns whether every letter is counted now; a step of a finished
    backfill is one key read."""
    begin, end = keys.dead_letters_range(app)
    mark = keys.meta_key(_COUNTED, app)

    def done(tr: KVTransaction) -> bytes | None:
        return tr.get(mark, snapshot=True)

    if _done(keys, app, run(kv, done)):
        return True

    def step(tr: KVTransaction) -> bool:
        start = tr.get(mark)  # with a conflict: two steps at once, one retries
        if start is None:
            tr.clear_range(*keys.meta_range(_NAME, app))
            tr.clear(keys.meta_key(_TOTAL, app))
            start = begin
        if start >= end:
            return True
        # Not snapshot: a letter written or removed in this range meanwhile aborts one.
        rows = tr.get_range(start, end, limit=max_keys)
        counts: Counter[tuple[str, str]] = Counter()
        boundary = start
        for key, value in rows:
            parts = keys.unpack(key)
            if len(parts) != 4:
                continue  # a chunk of a letter counted with it
            zone, item_id = ZoneId(str(parts[1]), str(parts[2])), str(parts[3])
            counts[_group_of_record(tr, keys, zone, item_id, key, value)] += 1
            boundary = key + b"\xff"  # past its chunks (keys.dead_letter_range_of)
        if len(rows) < max_keys:
            boundary = end
        tr.add_read_conflict_range(start, boundary)
        for group, n in counts.items():
            tr.add(keys.meta_key(_NAME, app, *group), pack_i64(n))
        tr.add(keys.meta_key(_TOTAL, app), pack_i64(sum(counts.values())))
        tr.set(mark, boundary)
        return boundary >= end

    return run(kv, step)


def _group_of_record(
    tr: KVTransaction, keys: KeySpace, zone: ZoneId, item_id: str, key: bytes, raw: bytes
) -> tuple[str, str]:
    try:
        n = dead_letter_chunks(key, raw)
        chunks = None
        if n:
            first = keys.dead_letter_chunk_key(zone, item_id, 0)
            stop = keys.dead_letter_chunk_key(zone, item_id, n)
            chunks = [v for _, v in tr.get_range(first, stop)]
        return letter_group(decode_dead_letter(key, raw, zone, item_id, chunks))
    except CorruptRecord:
        return group_of(None, CORRUPT)


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
    if cursor is None:
        advance(kv, keys, app)  # a store written before the counters: count on a step
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

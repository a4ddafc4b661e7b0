"""Pages of a list read from an opaque cursor, so a page of a list costs what it shows
(issue 43 point 2), not what lies behind it.

A cursor is the tuple-encoded suffix of the last key a page considered, below the list's
key prefix, in unpadded base64url: the next page reads from just after that key. It is
stable under writes: letters added or removed between two pages neither repeat nor shift
the rest, unlike an offset."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from quickzones.errors import InvalidArgument
from quickzones.store.kv import KVStore, KVTransaction, run
from quickzones.store.tuple_layer import fdbtuple

T = TypeVar("T")

DEFAULT_LIMIT = 50  # rows a page holds when the caller names no limit
_WHOLE = 1000  # rows a page of a whole-list read (read_all) holds
MAX_CURSOR = 4096  # characters: a key suffix is far shorter (names are at most 1,000)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list: its rows, in key order, and the cursor of the next page
    (``None``: the list ends here). A page may hold fewer rows than asked for and still
    have a next one: filters that are not part of the key skip rows, and a page stops
    after a bounded amount of skipping."""

    rows: list[T]
    next_cursor: str | None


def encode_cursor(prefix: bytes, key: bytes) -> str:
    """The cursor of ``key`` (a key below ``prefix``)."""
    if not key.startswith(prefix):
        raise ValueError("a cursor's key lies below the list's prefix")
    return base64.urlsafe_b64encode(key[len(prefix) :]).rstrip(b"=").decode("ascii")


def decode_cursor(prefix: bytes, cursor: str, arity: int) -> bytes:
    """The key a cursor names, below ``prefix``; its suffix must be a tuple of ``arity``
    elements. :class:`InvalidArgument` for anything else, so a hand-made or truncated
    cursor is a clear error, never a read from an arbitrary key."""
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR:
        raise InvalidArgument("cursor", cursor, "not a cursor of this list")
    try:
        suffix = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = fdbtuple.unpack(suffix)
    except (binascii.Error, ValueError, IndexError, TypeError, KeyError) as err:
        raise InvalidArgument("cursor", cursor, "not a cursor of this list") from err
    if len(parts) != arity or fdbtuple.pack(parts) != suffix:
        raise InvalidArgument("cursor", cursor, "not a cursor of this list")
    return prefix + suffix


def after(key: bytes) -> bytes:
    """The first key after ``key`` and every key it is a prefix of (a record's chunks)."""
    return key + b"\xff"


def check_limit(limit: object) -> int:
    """A page's ``limit``: a whole number of at least 1, else :class:`InvalidArgument`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument("limit", limit, "must be a whole number of at least 1")
    return limit


Span = tuple[bytes, bytes]


def read_page(
    kv: KVStore,
    prefix: bytes,
    spans: Sequence[Span],
    *,
    arity: int,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> Page[tuple[bytes, bytes]]:
    """One page of the (key, value) pairs of ``spans`` (key ranges below ``prefix``, in
    key order, each pair one row whose key's suffix is a tuple of ``arity``), from
    ``cursor`` on: at most ``limit`` rows and the cursor of the next page. It reads
    ``limit + 1`` keys at most (the one after the page says whether one follows), a span
    at a time in short snapshot transactions, so it never conflicts with a writer and
    costs what it shows whatever lies behind it. A cursor whose key lies outside the
    spans (another list's) is :class:`InvalidArgument`."""
    check_limit(limit)
    start = spans[0][0] if spans else b""
    if cursor is not None:
        key = decode_cursor(prefix, cursor, arity)
        if not any(begin <= key < end for begin, end in spans):
            raise InvalidArgument("cursor", cursor, "not a cursor of this list")
        start = after(key)
    rows: list[tuple[bytes, bytes]] = []
    for begin, end in spans:
        if start >= end:
            continue  # a span the cursor is past

        def read(
            tr: KVTransaction,
            s: bytes = max(start, begin),
            e: bytes = end,
            n: int = limit + 1 - len(rows),
        ) -> list[tuple[bytes, bytes]]:
            return tr.get_range(s, e, limit=n, snapshot=True)

        rows += run(kv, read)
        if len(rows) > limit:
            return Page(rows[:limit], encode_cursor(prefix, rows[limit - 1][0]))
    return Page(rows, None)


def read_all(
    kv: KVStore, prefix: bytes, spans: Sequence[Span], *, arity: int
) -> Iterator[tuple[bytes, bytes]]:
    """Every pair of ``spans``, a page at a time (:func:`read_page`), so a large list
    never meets the 5 s transaction lifetime: what a whole-list read (an admin figure)
    takes, never a page's."""
    cursor: str | None = None
    while True:
        page = read_page(kv, prefix, spans, arity=arity, limit=_WHOLE, cursor=cursor)
        yield from page.rows
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def merged_page(
    kv: KVStore,
    ranges: Sequence[tuple[bytes, bytes, bytes]],
    *,
    limit: int,
    after: bytes | None,
    match: Callable[[KVTransaction, bytes, bytes], T | None],
    skip: int,
) -> tuple[list[T], bytes | None]:
    """One page of a list kept in several ranges of one key shape (one per shard of a
    top-level queue), merged in key order: ``ranges`` are (prefix, begin, end), ``after``
    the key suffix below a prefix the previous page ended at. ``match`` turns a row into
    what the page shows, or None to pass over it (it may read more, in the same
    snapshot). Each range is read from ``after`` on: at most ``limit + 1`` matching rows,
    and at most ``skip`` rows in all, after which the page ends short at the last suffix
    every range has read past. Returns the rows and the suffix the next page starts
    after (None: the last page)."""
    found: list[tuple[bytes, T]] = []
    bound: bytes | None = None  # a range stopped early: the page ends at this suffix
    for prefix, begin, end in ranges:
        start = begin if after is None else max(begin, prefix + after + b"\x00")
        matched = scanned = 0
        while True:
            batch = max(1, min(limit + 1 - matched, skip - scanned))

            def read(
                tr: KVTransaction, s: bytes = start, e: bytes = end, n: int = batch
            ) -> list[tuple[bytes, T | None]]:
                rows = tr.get_range(s, e, limit=n, snapshot=True)
                return [(key, match(tr, key, value)) for key, value in rows]

            rows = run(kv, read)
            for key, row in rows:
                scanned += 1
                start = key + b"\x00"
                if row is not None:
                    found.append((key[len(prefix) :], row))
                    matched += 1
                    if matched > limit:
                        break
            if matched > limit or len(rows) < batch:
                break
            if scanned >= skip:
                last = start[len(prefix) : -1]
                bound = last if bound is None else min(bound, last)
                break
    found.sort(key=lambda pair: pair[0])
    if bound is not None:
        found = [pair for pair in found if pair[0] <= bound]
    if len(found) > limit:
        next_after: bytes | None = found[limit - 1][0]
    else:
        next_after = bound
    return [row for _, row in found[:limit]], next_after

"""Pages of a list read from an opaque cursor, so a page of a list costs what it shows
(issue 43 point 2), not what lies behind it.

A cursor is the tuple-encoded suffix of the last key a page considered, below the list's
key prefix, in unpadded base64url: the next page reads from just after that key. It is
stable under writes: letters added or removed between two pages neither repeat nor shift
the rest, unlike an offset."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Generic, TypeVar

import fdb.tuple as fdbtuple

from quickzones.errors import InvalidArgument

T = TypeVar("T")

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

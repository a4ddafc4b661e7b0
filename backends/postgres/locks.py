"""Which advisory locks a commit takes, so that only commits touching the same keys wait
for each other (issue 42: no global lock).

FoundationDB fails a transaction when a commit after its read version wrote a key it read.
The check (``quick_commit``, ``sql.py``) compares read conflict ranges with the write
conflict ranges that newer commits recorded; it is right only if no such commit can slip
between a transaction's check and its own commit. A single lock gave that (issue 30's
resolver) and made every quick commit in the database wait for the one before, and an
application's transaction that enqueued held it until its COMMIT. Here a commit holds
transaction-scoped advisory locks chosen so that any two commits where one writes what the
other read share a lock that one of them holds exclusively; commits that touch different
keys share only shared locks and never wait for each other.

Keys are ``fdb.tuple`` packings (``quickzones.store.keys``), so every key has a chain of
ancestors, its prefixes that end on an element boundary: ``(root,)``, ``(root, "z")``, ...
down to the key itself, above them all the empty prefix.

* a key read or written on its own (a point: ``[k, k + b"\\x00")``) takes its own lock,
  shared for a read and exclusive for a write, and each ancestor's lock shared;
* a range anchored at a prefix ``A`` (the longest element-boundary prefix of its begin that
  also starts its end, so every key in it lies under ``A``) takes ``A``'s lock exclusive
  and ``A``'s ancestors' shared.

A range read under ``A`` and a write of a key under ``A`` then meet on ``A``'s lock, which
the range holds exclusively; a point read and a point write of one key meet on that key's;
a range write (a clear) and a point read under it, or two overlapping ranges, the same
way. Two point writes of different keys, or a write and a read of different keys, take
only shared locks in common. A key that is not a tuple (the KV contract's raw keys) has the
empty prefix for its only ancestor, and a range over such keys anchors there: correct,
coarse. A commit that would take more than :data:`MOST_LOCKS` locks trades its deepest
locks for their parents' (exclusive: a parent held exclusively covers every key under it),
so a batch of a thousand items in one zone takes a handful.

Locks are pairs ``(space, crc32(prefix))``: ``space`` is the schema's, so two stores in
one database never wait for each other and an application's own single-key advisory locks
never meet quick's; a crc32 collision only makes two commits wait that need not.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable

import fdb.tuple as fdbtuple

Range = tuple[bytes, bytes]

# Locks one commit takes at most before its deepest are traded for their parents'.
MOST_LOCKS = 192


def lock_space(schema: str) -> int:
    """The first key of every advisory lock the schema's commits take (a signed int4)."""
    value = zlib.crc32(b"quickzones lock space " + schema.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def _lock_id(prefix: bytes) -> int:
    value = zlib.crc32(prefix)
    return value - (1 << 32) if value >= 1 << 31 else value


@functools.lru_cache(maxsize=65536)
def _parsed(key: bytes) -> tuple[tuple[int, ...], bool]:
    """The lengths of ``key``'s element-boundary prefixes, shortest first, the empty
    prefix (0) included and ``key`` itself excluded, and whether ``key`` is a whole packed
    tuple (if not, the prefixes are those of the whole elements it starts with: a range's
    end or a key cut inside an element)."""
    ends = [0]
    pos = 0
    try:
        while pos < len(key):
            _, pos = fdbtuple._decode(key, pos)
            if pos < len(key):
                ends.append(pos)
    except Exception:  # a tuple's head then bytes that are not: its whole elements
        return tuple(ends), False
    if pos != len(key):
        return tuple(ends), False
    return tuple(ends), True


def boundaries(key: bytes) -> tuple[int, ...]:
    """See :func:`_parsed`."""
    return _parsed(key)[0]


def _anchor(begin: bytes, end: bytes) -> int:
    """The length of the longest element-boundary prefix of ``begin`` that also starts
    ``end`` (and is not all of it): every key in ``[begin, end)`` starts with it, and it
    is an element-boundary prefix of each of them, so their writes take its lock."""
    ends, whole = _parsed(begin)
    candidates = (*ends, len(begin)) if whole else ends
    best = 0
    for length in candidates:
        if end.startswith(begin[:length]) and end != begin[:length]:
            best = length
        else:
            break
    return best


class LockPlan:
    """The locks of one commit: each prefix with whether it is held exclusively."""

    __slots__ = ("_modes",)

    def __init__(self) -> None:
        # prefix -> exclusive; the key itself is a "prefix" of full length.
        self._modes: dict[bytes, bool] = {}

    def _take(self, prefix: bytes, exclusive: bool) -> None:
        if exclusive or prefix not in self._modes:
            self._modes[prefix] = exclusive or self._modes.get(prefix, False)

    def _ancestors(self, key: bytes, length: int) -> None:
        for cut in boundaries(key):
            if cut >= length:
                break
            self._take(key[:cut], False)

    def add(self, ranges: Iterable[Range], *, write: bool) -> LockPlan:
        for begin, end in ranges:
            if end == begin + b"\x00":
                self._ancestors(begin, len(begin))
                self._take(begin, write)
            else:
                length = _anchor(begin, end)
                self._ancestors(begin, length)
                self._take(begin[:length], True)
        return self

    def _escalate(self) -> None:
        """Trade the deepest locks for their parents', exclusively."""
        deepest = max(len(boundaries(p)) + (1 if p else 0) for p in self._modes)
        modes: dict[bytes, bool] = {}
        for prefix, exclusive in self._modes.items():
            depth = len(boundaries(prefix)) + (1 if prefix else 0)
            if depth == deepest and prefix:
                parent = prefix[: boundaries(prefix)[-1]]
                modes[parent] = True
            elif exclusive or prefix not in modes:
                modes[prefix] = exclusive or modes.get(prefix, False)
        self._modes = modes

    def ids(self) -> tuple[list[int], list[bool]]:
        """The lock ids, sorted (every commit takes its locks in this order, so two
        commits never wait for each other in a cycle), and which are exclusive."""
        while len(self._modes) > MOST_LOCKS:
            self._escalate()
        merged: dict[int, bool] = {}
        for prefix, exclusive in self._modes.items():
            lock = _lock_id(prefix)
            merged[lock] = exclusive or merged.get(lock, False)
        order = sorted(merged)
        return order, [merged[i] for i in order]


def plan(reads: Iterable[Range], writes: Iterable[Range]) -> tuple[list[int], list[bool]]:
    """The sorted lock ids and modes of a commit with these conflict ranges."""
    return LockPlan().add(reads, write=False).add(writes, write=True).ids()

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
from collections.abc import Iterable, Sequence

from quickzones.store.tuple_layer import fdbtuple

Range = tuple[bytes, bytes]

# Locks one commit takes at most before its deepest are traded for their parents'.
MOST_LOCKS = 192


def lock_space(schema: str) -> int:
    """The first key of every advisory lock the schema's commits take (a signed int4)."""
    value = zlib.crc32(b"quickzones lock space " + schema.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


@functools.lru_cache(maxsize=65536)  # ancestors recur in every commit of their zone
def _lock_id(prefix: bytes) -> int:
    value = zlib.crc32(prefix)
    return value - (1 << 32) if value >= 1 << 31 else value


# Type codes of fdb.tuple's encoding whose element length the scan below knows without
# decoding: null; byte and unicode strings (to an unescaped 0x00); integers of 0 to 8
# bytes (the length is in the code). Any other element is decoded by fdb.tuple.
_NULL, _BYTES, _STRING = 0x00, 0x01, 0x02
_INT_ZERO = 0x14
_INT_SHORTEST, _INT_LONGEST = 0x0C, 0x1C


@functools.lru_cache(maxsize=65536)
def _parsed(key: bytes) -> tuple[tuple[int, ...], bool]:
    """The lengths of ``key``'s element-boundary prefixes, shortest first, the empty
    prefix (0) included and ``key`` itself excluded, and whether ``key`` is a whole packed
    tuple (if not, the prefixes are those of the whole elements it starts with: a range's
    end or a key cut inside an element).

    The elements quick's keys are made of are measured from their bytes (a commit plans
    locks for every new key it writes, and decoding each element into a Python value was
    most of that cost); the answer is exactly fdb.tuple's, which every other element is
    still decoded by, so processes of older releases plan the same locks."""
    ends = [0]
    pos = 0
    size = len(key)
    find = key.find
    while pos < size:
        code = key[pos]
        if code in (_BYTES, _STRING):
            end = find(b"\x00", pos + 1)
            while end >= 0 and end + 1 < size and key[end + 1] == 0xFF:
                end = find(b"\x00", end + 2)  # an escaped 0x00 inside the string
            if end < 0:
                return tuple(ends), False  # no terminator: cut inside the element
            if code == _STRING:
                text = key[pos + 1 : end]
                if not text.isascii():
                    try:  # fdb.tuple refuses a string that is not UTF-8
                        text.replace(b"\x00\xff", b"\x00").decode("utf-8")
                    except UnicodeDecodeError:
                        return tuple(ends), False
            pos = end + 1
        elif _INT_SHORTEST <= code <= _INT_LONGEST:
            pos += 1 + abs(code - _INT_ZERO)
            if pos > size:
                return tuple(ends), False
        elif code == _NULL:
            pos += 1
        else:
            try:
                _, pos = fdbtuple._decode(key, pos)
            except Exception:  # a tuple's head then bytes that are not: its whole elements
                return tuple(ends), False
            if pos > size:
                return tuple(ends), False
        if pos < size:
            ends.append(pos)
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


@functools.lru_cache(maxsize=65536)
def _ancestry(key: bytes) -> tuple[bytes, ...]:
    """``key``'s element-boundary prefixes (:func:`boundaries`), as bytes: the same
    objects each time, so the sets of a plan hash them once."""
    return tuple(key[:cut] for cut in boundaries(key))


class LockPlan:
    """The locks of one commit: the prefixes held exclusively and those held shared (a
    prefix in both is held exclusively; the key itself is a "prefix" of full length)."""

    __slots__ = ("_exclusive", "_shared")

    def __init__(self) -> None:
        self._exclusive: set[bytes] = set()
        self._shared: set[bytes] = set()

    def add(self, ranges: Iterable[Range], *, write: bool, own_only: bool = False) -> LockPlan:
        for begin, end in ranges:
            if _is_point(begin, end):
                if not own_only:
                    self._shared.update(_ancestry(begin))
                (self._exclusive if write else self._shared).add(begin)
            else:
                length = _anchor(begin, end)
                self._shared.update(p for p in _ancestry(begin) if len(p) < length)
                self._exclusive.add(begin[:length])
        return self

    def _modes(self) -> dict[bytes, bool]:
        modes = dict.fromkeys(self._shared, False)
        modes.update(dict.fromkeys(self._exclusive, True))
        return modes

    @staticmethod
    def _escalate(modes: dict[bytes, bool]) -> dict[bytes, bool]:
        """Trade the deepest locks for their parents', exclusively."""
        deepest = max(len(boundaries(p)) + (1 if p else 0) for p in modes)
        out: dict[bytes, bool] = {}
        for prefix, exclusive in modes.items():
            depth = len(boundaries(prefix)) + (1 if prefix else 0)
            if depth == deepest and prefix:
                parent = prefix[: boundaries(prefix)[-1]]
                out[parent] = True
            elif exclusive or prefix not in out:
                out[prefix] = exclusive or out.get(prefix, False)
        return out

    def ids(self) -> tuple[list[int], list[bool]]:
        """The lock ids, sorted (every commit takes its locks in this order, so two
        commits never wait for each other in a cycle), and which are exclusive."""
        exclusive, shared = self._exclusive, self._shared
        if len(exclusive | shared) > MOST_LOCKS:
            modes = self._modes()
            while len(modes) > MOST_LOCKS:
                modes = self._escalate(modes)
            exclusive = {p for p, x in modes.items() if x}
            shared = {p for p, x in modes.items() if not x}
            self._exclusive, self._shared = exclusive, shared
        held = {_lock_id(p) for p in exclusive}
        order = sorted(held.union(map(_lock_id, shared)))
        return order, [i in held for i in order]


def _is_point(begin: bytes, end: bytes) -> bool:
    return len(end) == len(begin) + 1 and end[-1] == 0 and end.startswith(begin)


def plan(
    reads: Sequence[Range], writes: Iterable[Range], *, held_long: bool = False
) -> tuple[list[int], list[bool]]:
    """The sorted lock ids and modes of a commit with these conflict ranges.
    ``held_long``: the commit is into an application's open transaction (its locks last
    until the application's COMMIT); if it read only single keys, its single-key writes
    take their own locks alone (see the module's notes)."""
    own_only = held_long and all(_is_point(b, e) for b, e in reads)
    return LockPlan().add(reads, write=False).add(writes, write=True, own_only=own_only).ids()

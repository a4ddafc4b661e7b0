"""Key-range algebra for the transaction buffer and the conflict check."""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator

Range = tuple[bytes, bytes]


def merge_ranges(ranges: Iterable[Range], *, in_order: bool = False) -> list[Range]:
    """Sorted, disjoint, non-adjacent ranges covering the same keys; empty ones dropped.
    ``in_order``: ``ranges`` are already sorted and none is empty (not sorted again)."""
    out: list[Range] = []
    for begin, end in ranges if in_order else sorted([r for r in ranges if r[0] < r[1]]):
        if out and begin <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((begin, end))
    return out


def ranges_intersect(a: list[Range], b: list[Range]) -> bool:
    """Whether two sorted disjoint range lists share a key (two-pointer walk)."""
    i = j = 0
    while i < len(a) and j < len(b):
        a_begin, a_end = a[i]
        b_begin, b_end = b[j]
        if a_begin < b_end and b_begin < a_end:
            return True
        if a_end <= b_end:
            i += 1
        else:
            j += 1
    return False


def encode_ranges(ranges: list[Range]) -> bytes:
    """Compact length-prefixed encoding of a range list (stored by the sqlite backend)."""
    parts: list[bytes] = []
    for begin, end in ranges:
        parts.append(struct.pack("<II", len(begin), len(end)))
        parts.append(begin)
        parts.append(end)
    return b"".join(parts)


def decode_ranges(raw: bytes) -> list[Range]:
    out: list[Range] = []
    pos = 0
    while pos < len(raw):
        nb, ne = struct.unpack_from("<II", raw, pos)
        pos += 8
        begin = raw[pos : pos + nb]
        pos += nb
        out.append((begin, raw[pos : pos + ne]))
        pos += ne
    return out


class RangeSet:
    """Disjoint sorted ranges (the transaction's cleared ranges), merged on insert."""

    __slots__ = ("_begins", "_ends")

    def __init__(self) -> None:
        self._begins: list[bytes] = []
        self._ends: list[bytes] = []

    def __bool__(self) -> bool:
        return bool(self._begins)

    def __iter__(self) -> Iterator[Range]:
        return zip(self._begins, self._ends, strict=True)

    def add(self, begin: bytes, end: bytes) -> None:
        if begin >= end:
            return
        # Ranges ending before `begin` stay left; ranges starting after `end` stay right;
        # everything between touches [begin, end) and is absorbed.
        i = bisect.bisect_left(self._ends, begin)
        j = bisect.bisect_right(self._begins, end)
        if i < j:
            begin = min(begin, self._begins[i])
            end = max(end, self._ends[j - 1])
        self._begins[i:j] = [begin]
        self._ends[i:j] = [end]

    def contains(self, key: bytes) -> bool:
        i = bisect.bisect_right(self._begins, key) - 1
        return i >= 0 and key < self._ends[i]

    def clip(self, begin: bytes, end: bytes) -> list[Range]:
        """The parts of the set inside ``[begin, end)``, in order."""
        i = bisect.bisect_right(self._ends, begin)
        out: list[Range] = []
        while i < len(self._begins) and self._begins[i] < end:
            out.append((max(begin, self._begins[i]), min(end, self._ends[i])))
            i += 1
        return out

    def covers(self, begin: bytes, end: bytes) -> bool:
        i = bisect.bisect_right(self._begins, begin) - 1
        return i >= 0 and self._ends[i] >= end

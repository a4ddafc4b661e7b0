"""Read and write conflict ranges, recorded as FDB's RYW layer records them."""

from __future__ import annotations

import bisect

from quickzones.backends._ranges import Range
from quickzones.backends.txnbuffer.buffer import _ATOMIC
from quickzones.backends.txnbuffer.checks import _check_conflict_range, _require_bytes
from quickzones.backends.txnbuffer.state import TxnState
from quickzones.store.kv import key_after


class ConflictRanges(TxnState):
    """A transaction's conflict ranges: read ones minus what it wrote, explicit ones."""

    def _add_conflict_raw(self, begin: bytes, end: bytes) -> None:
        self._read_conflicts.append((begin, end))
        self._conflict_bytes += len(begin) + len(end)

    def _add_read_conflict(self, begin: bytes, end: bytes) -> None:
        """Add ``[begin, end)`` minus what this transaction already set or cleared."""
        if begin >= end:
            return
        holes: list[Range] = [] if self._cleared is None else self._cleared.clip(begin, end)
        lo = bisect.bisect_left(self._point_keys, begin)
        hi = bisect.bisect_left(self._point_keys, end)
        for key in self._point_keys[lo:hi]:
            # Keys with pending atomic ops depend on storage; everything else is known.
            if self._points[key].kind != _ATOMIC:
                holes.append((key, key_after(key)))
        if not holes:
            self._add_conflict_raw(begin, end)
            return
        holes.sort()
        cursor = begin
        for h_begin, h_end in holes:
            if cursor < h_begin:
                self._add_conflict_raw(cursor, h_begin)
            if h_end > cursor:
                cursor = h_end
        if cursor < end:
            self._add_conflict_raw(cursor, end)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        _require_bytes("begin", begin)
        _require_bytes("end", end)
        _check_conflict_range(begin, end)
        self._add_read_conflict(begin, end)

    def add_read_conflict_key(self, key: bytes) -> None:
        self.add_read_conflict_range(key, key_after(key))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        _require_bytes("begin", begin)
        _require_bytes("end", end)
        _check_conflict_range(begin, end)
        if begin < end:
            self._write_conflicts.append((begin, end))
            self._conflict_bytes += len(begin) + len(end)

    def add_write_conflict_key(self, key: bytes) -> None:
        self.add_write_conflict_range(key, key_after(key))

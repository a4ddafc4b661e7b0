"""Reads: the transaction's own writes merged over the storage snapshot."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from quickzones.backends._atomics import apply_atomic_stack
from quickzones.backends.txnbuffer.buffer import _CLEAR, _SET, _VS_VALUE, KeyValue, _Point
from quickzones.backends.txnbuffer.checks import SYSTEM_PREFIX, _check_range, _require_bytes
from quickzones.backends.txnbuffer.conflicts import ConflictRanges
from quickzones.errors import InvalidArgument
from quickzones.store.kv import (
    ACCESSED_UNREADABLE,
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_SIZE_LIMIT,
    KVError,
    key_after,
)


class BufferedReads(ConflictRanges):
    """``get``, ``get_many``, ``get_range`` and ``prefetch_range`` (read-your-writes)."""

    def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        self._check_open()
        return self._get(key, snapshot)

    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        if not isinstance(key, bytes):
            _require_bytes("key", key)
        if len(key) > KEY_SIZE_LIMIT:
            return None  # FDB: an over-long key cannot exist, so reading it finds nothing.
        if key >= SYSTEM_PREFIX:
            raise KVError(KEY_OUTSIDE_LEGAL_RANGE, f"key {key[:20]!r} is in the system keyspace")
        if self._vs_keys:
            self._check_readable(key, key_after(key))
        point = self._points.get(key)
        if point is not None:
            if point.unreadable:
                raise KVError(ACCESSED_UNREADABLE, "value was versionstamped in this txn")
            if point.kind == _SET or point.kind == _CLEAR:
                return point.value
            if point.kind == _VS_VALUE:
                raise KVError(ACCESSED_UNREADABLE, "value was versionstamped in this txn")
            # A pending atomic op needs the stored value, so the read conflicts after all.
            if not snapshot:
                self._add_conflict_raw(key, key_after(key))
            return apply_atomic_stack(self._storage_get(key), point.ops)
        if self._cleared is not None and self._cleared.contains(key):
            return None
        if not snapshot:
            self._add_conflict_raw(key, key + b"\x00")  # key_after(key), without a call
        return self._storage_get(key)

    def get_many(self, keys: Sequence[bytes], *, snapshot: bool = False) -> list[bytes | None]:
        """``get`` of each key, in order, with the same conflicts and errors; the keys
        that need storage are read in one storage call first (:meth:`_read_keys`), so a
        batch of item reads is one statement on SQLite, not one each."""
        self._check_open()
        points, cache, cleared = self._points, self._read_cache, self._cleared
        ranges = self._range_cache
        wanted = [
            key
            for key in dict.fromkeys(keys)
            if isinstance(key, bytes)
            and len(key) <= KEY_SIZE_LIMIT
            and key < SYSTEM_PREFIX
            and key not in points
            and key not in cache
            and not (cleared is not None and cleared.contains(key))
            and not (ranges and self._cached_range(key, key_after(key)))
        ]
        if len(wanted) > 1:
            if self._read_version is None:
                # The transaction's first read: its snapshot opens with it.
                self._read_time = self._now()
                self._read_version, values = self._read_version_and_keys(wanted)
            else:
                values = self._read_keys(wanted)
            self._read_cache.update(zip(wanted, values, strict=True))
        return [self._get(key, snapshot) for key in keys]

    def _storage_get(self, key: bytes) -> bytes | None:
        # Like FDB's RYW snapshot cache: a key read once is not fetched again, so it stays
        # readable even after the read version is too old for storage.
        if key in self._read_cache:
            return self._read_cache[key]
        cached = self._cached_range(key, key_after(key)) if self._range_cache else None
        if cached is not None:
            keys, pairs = cached
            at = bisect.bisect_left(keys, key)
            return pairs[at][1] if at < len(keys) and keys[at] == key else None
        self._ensure_read_version()
        value = self._read_key(key)
        self._read_cache[key] = value
        return value

    def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        _check_range(begin, end)
        if limit < 0:
            raise InvalidArgument("limit", limit, "must be >= 0 (0 means no limit)")
        if begin >= end:
            return []
        if self._vs_keys:
            self._check_readable(begin, end)
        out: list[KeyValue] = []
        for seg_begin, seg_end, cleared in self._segments(begin, end, reverse):
            need = limit - len(out) if limit else 0
            for pair in self._merge_segment(seg_begin, seg_end, cleared, reverse, need):
                out.append(pair)
                if limit and len(out) >= limit:
                    break
            if limit and len(out) >= limit:
                break
        if not snapshot:
            if limit and len(out) >= limit:
                if reverse:
                    self._add_read_conflict(out[-1][0], end)
                else:
                    self._add_read_conflict(begin, key_after(out[-1][0]))
            else:
                self._add_read_conflict(begin, end)
        return out

    def _segments(self, begin: bytes, end: bytes, reverse: bool) -> list[tuple[bytes, bytes, bool]]:
        """``[begin, end)`` cut into runs cleared by this txn (True) and not (False)."""
        segments: list[tuple[bytes, bytes, bool]] = []
        cursor = begin
        cleared = [] if self._cleared is None else self._cleared.clip(begin, end)
        for c_begin, c_end in cleared:
            if cursor < c_begin:
                segments.append((cursor, c_begin, False))
            segments.append((c_begin, c_end, True))
            cursor = c_end
        if cursor < end:
            segments.append((cursor, end, False))
        if reverse:
            segments.reverse()
        return segments

    def _local_value(self, key: bytes, point: _Point, stored: bytes | None) -> bytes | None:
        if point.unreadable:
            raise KVError(ACCESSED_UNREADABLE, "range holds a versionstamped value of this txn")
        if point.kind == _SET or point.kind == _CLEAR:
            return point.value
        if point.kind == _VS_VALUE:
            raise KVError(ACCESSED_UNREADABLE, "range holds a versionstamped value of this txn")
        return apply_atomic_stack(stored, point.ops)

    def _merge_segment(
        self, begin: bytes, end: bytes, cleared: bool, reverse: bool, need: int
    ) -> Iterator[KeyValue]:
        lo = bisect.bisect_left(self._point_keys, begin)
        hi = bisect.bisect_left(self._point_keys, end)
        local = self._point_keys[lo:hi]
        if reverse:
            local.reverse()
        if cleared:
            # Storage is hidden here; only writes made after the clear_range show.
            for key in local:
                value = self._local_value(key, self._points[key], None)
                if value is not None:
                    yield key, value
            return
        # Local sets that start the segment with no gap (the key at ``begin``, then the key
        # right after it, ...; mirrored for reverse) need no storage: FDB's RYW answers them
        # without a read version, so a read that they satisfy does not fix the read version
        # early (found by the differential test, seed 5445: a later conflict hinged on it).
        li = 0
        while li < len(local):
            point = self._points[local[li]]
            if point.kind not in (_SET, _CLEAR) or point.unreadable:
                break
            if (key_after(local[li]) != end) if reverse else (local[li] != begin):
                break
            if reverse:
                end = local[li]
            else:
                begin = key_after(local[li])
            li += 1
            if point.value is not None:
                yield local[li - 1], point.value
                if need:
                    need -= 1
                    if need == 0:
                        return
        local = local[li:]
        li = 0
        if begin >= end:
            return
        # need + len(local) stored rows always suffice: each local key hides at most one.
        batch = need + len(local) if need else 0
        stored = self._storage_scan(begin, end, reverse, batch)
        for key, value in stored:
            while li < len(local) and (local[li] > key if reverse else local[li] < key):
                lkey = local[li]
                li += 1
                lvalue = self._local_value(lkey, self._points[lkey], None)
                if lvalue is not None:
                    yield lkey, lvalue
            if li < len(local) and local[li] == key:
                li += 1
                merged = self._local_value(key, self._points[key], value)
                if merged is not None:
                    yield key, merged
            else:
                yield key, value
        for lkey in local[li:]:
            lvalue = self._local_value(lkey, self._points[lkey], None)
            if lvalue is not None:
                yield lkey, lvalue

    def prefetch_range(self, begin: bytes, end: bytes, limit: int) -> bool:
        """Read ``[begin, end)`` from storage now, in one read, and answer this
        transaction's later storage reads inside it from what came back; True if it holds
        at most ``limit`` pairs (else nothing is kept). Adds no read conflict: each later
        read adds its own, as without the prefetch. Storage is a fixed snapshot (the read
        version), so a read answered here is the read storage would have answered: a zone
        visit reads a small zone's order entries, item records and count key a few times
        over, and each storage read is a statement (SQLite) that also lets other threads
        take the interpreter."""
        self._check_open()
        _check_range(begin, end)
        if limit < 1:
            raise InvalidArgument("limit", limit, "must be at least 1")
        if begin >= end or self._cached_range(begin, end) is not None:
            return True
        prefix = self._cached_prefix(begin, end)
        if prefix is not None and len(prefix[2]) - bisect.bisect_left(prefix[1], begin) > limit:
            return False  # a read ahead already holds more than ``limit`` pairs of it
        self._ensure_read_version()
        pairs = self._read_range(begin, end, limit + 1, False)
        if len(pairs) > limit:
            return False
        self._range_cache.append((begin, end, [k for k, _ in pairs], pairs))
        return True

    def _cached_range(self, begin: bytes, end: bytes) -> tuple[list[bytes], list[KeyValue]] | None:
        for c_begin, c_end, keys, pairs in self._range_cache:
            if c_begin <= begin and end <= c_end:
                return keys, pairs
        return None

    def _cached_prefix(
        self, begin: bytes, end: bytes
    ) -> tuple[bytes, list[bytes], list[KeyValue]] | None:
        """A kept range that holds ``[begin, c_end)`` of ``[begin, end)`` (``c_end`` before
        ``end``): (c_end, its keys, its pairs); a forward scan reads storage only past it."""
        for c_begin, c_end, keys, pairs in self._range_cache:
            if c_begin <= begin < c_end < end:
                return c_end, keys, pairs
        return None

    def _keep_read_ahead(
        self,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        ranges: Sequence[tuple[bytes, bytes, int]],
        rows: Sequence[list[KeyValue]],
    ) -> None:
        """Keep what a read ahead (a backend's ``read_ahead``) brought from storage at the
        read version: the values of ``keys``, and for each ``(begin, end, limit)`` of
        ``ranges`` its first pairs, which hold all of ``[begin, end)`` when fewer than
        ``limit`` came back, else all of it up to just past the last. Later reads inside
        them are answered here, each adding its own read conflicts as without it (the
        read ahead adds none): storage is a fixed snapshot, so what is kept is what
        storage would answer."""
        for key, value in zip(keys, values, strict=True):
            self._read_cache.setdefault(key, value)
        for (begin, end, limit), pairs in zip(ranges, rows, strict=True):
            upto = end if len(pairs) < limit else key_after(pairs[-1][0])
            self._range_cache.append((begin, upto, [k for k, _ in pairs], pairs))

    def _storage_scan(
        self, begin: bytes, end: bytes, reverse: bool, batch: int
    ) -> Iterator[KeyValue]:
        """Lazily page through storage at the read version."""
        cached = self._cached_range(begin, end)
        if cached is not None:
            keys, pairs = cached
            inside = pairs[bisect.bisect_left(keys, begin) : bisect.bisect_left(keys, end)]
            yield from reversed(inside) if reverse else inside
            return
        prefix = None if reverse or not self._range_cache else self._cached_prefix(begin, end)
        if prefix is not None:
            # A read ahead holds the scan's first part: storage only past it, if needed.
            c_end, keys, pairs = prefix
            inside = pairs[bisect.bisect_left(keys, begin) :]
            yield from inside
            begin = c_end
            if batch:
                batch = max(1, batch - len(inside))
        self._ensure_read_version()
        while True:
            rows = self._read_range(begin, end, batch, reverse)
            yield from rows
            if not batch or len(rows) < batch:
                return
            if reverse:
                end = rows[-1][0]
            else:
                begin = key_after(rows[-1][0])
            batch *= 2

"""Writes: set, clear, clear_range, atomic ops and versionstamped writes, buffered."""

from __future__ import annotations

import bisect

from quickzones.backends._atomics import AtomicOp, apply_atomic
from quickzones.backends._ranges import RangeSet
from quickzones.backends._versionstamps import (
    VERSIONSTAMP_SIZE,
    fill_versionstamp,
    split_versionstamp_template,
)
from quickzones.backends.txnbuffer.buffer import (
    _ATOMIC,
    _CLEAR,
    _SET,
    _VS_VALUE,
    _Point,
    _VersionstampedKey,
)
from quickzones.backends.txnbuffer.checks import (
    INVERTED_RANGE,
    SYSTEM_PREFIX,
    _check_range,
    _check_value,
    _check_write_key,
    _require_bytes,
)
from quickzones.backends.txnbuffer.commit_request import _VersionstampFuture
from quickzones.backends.txnbuffer.state import TxnState
from quickzones.store.kv import (
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_SIZE_LIMIT,
    KEY_TOO_LARGE,
    KVError,
    key_after,
)


class BufferedWrites(TxnState):
    """The writes of a transaction, kept in the client until commit."""

    def set(self, key: bytes, value: bytes) -> None:
        self._check_open()
        _check_write_key(key)
        _check_value(value)
        prev = self._points.get(key)
        stamped = prev is not None and (prev.kind == _VS_VALUE or prev.unreadable)
        self._put_point(key, _Point(_SET, value, self._next_seq(), unreadable=stamped))
        self._mutation_bytes += len(key) + len(value)

    def clear(self, key: bytes) -> None:
        self._check_open()
        _require_bytes("key", key)
        if len(key) > KEY_SIZE_LIMIT:
            return  # FDB: clearing a key that cannot exist is a no-op.
        _check_write_key(key)
        self._put_point(key, _Point(_CLEAR, None, self._next_seq()))
        self._mutation_bytes += len(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._check_open()
        _check_range(begin, end)
        if begin > end:
            raise KVError(INVERTED_RANGE, f"clear_range begin {begin!r} > end {end!r}")
        if begin == end:
            return
        seq = self._next_seq()
        lo = bisect.bisect_left(self._point_keys, begin)
        hi = bisect.bisect_left(self._point_keys, end)
        for key in self._point_keys[lo:hi]:
            del self._points[key]
        del self._point_keys[lo:hi]
        if self._cleared is None:
            self._cleared = RangeSet()
        self._cleared.add(begin, end)
        self._clear_log.append((seq, begin, end))
        # A versionstamped key that must land inside the cleared range is gone for good.
        self._vs_keys = [
            vs
            for vs in self._vs_keys
            if not (begin <= vs.unreadable[0] and vs.unreadable[1] <= end)
        ]
        self._mutation_bytes += len(begin) + len(end)

    def _atomic(self, op: AtomicOp, key: bytes, param: bytes) -> None:
        self._check_open()
        _check_write_key(key)
        _check_value(param)
        seq = self._next_seq()
        point = self._points.get(key)
        if point is None:
            if self._cleared is not None and self._cleared.contains(key):
                value = apply_atomic(op, None, param)
                self._put_point(key, _Point(_SET if value is not None else _CLEAR, value, seq))
            else:
                self._put_point(key, _Point(_ATOMIC, None, seq, ops=[(op, param)]))
        elif point.kind == _SET or point.kind == _CLEAR:
            # The base is known locally, so the op folds into a plain set (as FDB's WriteMap does).
            value = apply_atomic(op, point.value, param)
            kind = _SET if value is not None else _CLEAR
            self._put_point(key, _Point(kind, value, seq, unreadable=point.unreadable))
        else:
            point.ops.append((op, param))
            point.seq = seq
        self._mutation_bytes += len(key) + len(param)

    def add(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.ADD, key, param)

    def max(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.MAX, key, param)

    def min(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.MIN, key, param)

    def bit_and(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.BIT_AND, key, param)

    def bit_or(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.BIT_OR, key, param)

    def bit_xor(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.BIT_XOR, key, param)

    def byte_max(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.BYTE_MAX, key, param)

    def byte_min(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.BYTE_MIN, key, param)

    def append_if_fits(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.APPEND_IF_FITS, key, param)

    def compare_and_clear(self, key: bytes, param: bytes) -> None:
        self._atomic(AtomicOp.COMPARE_AND_CLEAR, key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._check_open()
        _require_bytes("key", key)
        _check_value(value)
        body, pos = split_versionstamp_template(key, "key")
        if len(body) > KEY_SIZE_LIMIT:
            raise KVError(KEY_TOO_LARGE, f"key of {len(body)} bytes exceeds {KEY_SIZE_LIMIT}")
        low = fill_versionstamp(body, pos, b"\x00" * VERSIONSTAMP_SIZE)
        high = fill_versionstamp(body, pos, b"\xff" * VERSIONSTAMP_SIZE)
        if high >= SYSTEM_PREFIX:
            raise KVError(
                KEY_OUTSIDE_LEGAL_RANGE, "versionstamped key may reach the system keyspace"
            )
        self._vs_keys.append(
            _VersionstampedKey(body, pos, value, self._next_seq(), (low, key_after(high)))
        )
        self._vs_span = (min(self._vs_span[0], low), max(self._vs_span[1], key_after(high)))
        self._mutation_bytes += len(body) + len(value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._check_open()
        _check_write_key(key)
        _require_bytes("value", value)
        body, pos = split_versionstamp_template(value, "value")
        _check_value(body)
        self._put_point(key, _Point(_VS_VALUE, body, self._next_seq(), vs_pos=pos))
        self._mutation_bytes += len(key) + len(body)

    def get_versionstamp(self) -> _VersionstampFuture:
        return self._versionstamp

"""The checks every call makes on its arguments first, and the FDB error codes the
buffer raises that ``kv.py`` does not name."""

from __future__ import annotations

from quickzones.errors import InvalidArgument
from quickzones.store.kv import (
    KEY_OUTSIDE_LEGAL_RANGE,
    KEY_SIZE_LIMIT,
    KEY_TOO_LARGE,
    VALUE_SIZE_LIMIT,
    VALUE_TOO_LARGE,
    KVError,
)

# FDB error codes kv.py does not name (fdb api-error-codes.rst).
INVERTED_RANGE = 2005
FUTURE_NOT_SET = 2015
USED_DURING_COMMIT = 2017
NO_COMMIT_VERSION = 2021
INTERNAL_ERROR = 4100

# Keys at or after \xff are FDB's system keyspace; the seam gives no system-key access.
SYSTEM_PREFIX = b"\xff"


def _require_bytes(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise InvalidArgument(name, value, f"must be bytes, not {type(value).__name__}")


def _check_write_key(key: bytes) -> None:
    if not isinstance(key, bytes):  # the test inline: every write makes this check
        _require_bytes("key", key)
    if len(key) > KEY_SIZE_LIMIT:
        raise KVError(KEY_TOO_LARGE, f"key of {len(key)} bytes exceeds {KEY_SIZE_LIMIT}")
    if key >= SYSTEM_PREFIX:
        raise KVError(KEY_OUTSIDE_LEGAL_RANGE, f"key {key[:20]!r} is in the system keyspace")


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        _require_bytes("value", value)
    if len(value) > VALUE_SIZE_LIMIT:
        raise KVError(VALUE_TOO_LARGE, f"value of {len(value)} bytes exceeds {VALUE_SIZE_LIMIT}")


def _check_conflict_range(begin: bytes, end: bytes) -> None:
    # FDB 7.3 refuses an inverted conflict range at the call with 2005 (found by the
    # differential test against the engine, seeds 79, 164, 171).
    if begin > end:
        raise KVError(INVERTED_RANGE, f"conflict range begin {begin[:20]!r} > end {end[:20]!r}")


def _check_range(begin: bytes, end: bytes) -> None:
    _require_bytes("begin", begin)
    _require_bytes("end", end)
    if end > SYSTEM_PREFIX or begin > SYSTEM_PREFIX:
        raise KVError(KEY_OUTSIDE_LEGAL_RANGE, "range reaches past b'\\xff' (system keyspace)")

"""SQLite's errors as storage errors: which are lock contention, a full disk, not a
database; and the one translation every caller uses."""

from __future__ import annotations

import sqlite3

from quickzones.backends.txnbuffer import INTERNAL_ERROR
from quickzones.errors import StorageError, StoreFull
from quickzones.store.kv import DATABASE_LOCKED, KVError

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_FULL = 13
_SQLITE_NOTADB = 26


def _is_busy(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "locked" in str(err) or "busy" in str(err)


def _is_full(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code == _SQLITE_FULL or "disk is full" in str(err)


def _is_not_a_database(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", 0) & 0xFF
    return code == _SQLITE_NOTADB or "not a database" in str(err)


def _translate(err: sqlite3.Error, during: str, store: str = "") -> StorageError:
    """SQLite errors as storage errors: brief lock contention is retryable (1038), a full
    disk is :class:`StoreFull` (SQLite rolls the transaction back: nothing was written),
    the rest is not retryable."""
    failure: StorageError
    if _is_full(err):
        failure = StoreFull(store or "sqlite", f"sqlite: {err} during {during}")
    elif _is_busy(err):
        failure = KVError(DATABASE_LOCKED, f"sqlite busy during {during}: {err}")
    else:
        failure = KVError(INTERNAL_ERROR, f"sqlite error during {during}: {err}")
    failure.__cause__ = err
    return failure

"""PostgreSQL's errors as storage errors, translated in one place."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from quickzones.backends.txnbuffer import INTERNAL_ERROR
from quickzones.errors import StorageError, StoreFull
from quickzones.store.kv import COMMIT_UNKNOWN_RESULT, DATABASE_LOCKED, NOT_COMMITTED, KVError

# A lost or refused connection, a server shutting down or restarting: nothing of a
# transaction that had not sent COMMIT is stored, so it is retried like FDB's 1038.
_UNAVAILABLE = (
    psycopg.OperationalError,
    pgerrors.AdminShutdown,
    pgerrors.CrashShutdown,
    pgerrors.CannotConnectNow,
)


def translate(err: psycopg.Error, during: str, store: str = "") -> StorageError:
    """A psycopg error as a storage error: a serialization failure or deadlock is a
    conflict (1020), an unreachable server or a lock wait past ``lock_timeout`` is
    retryable (1038), a full disk is :class:`StoreFull`, the rest is not retryable."""
    failure: StorageError
    if isinstance(err, pgerrors.DiskFull):
        failure = StoreFull(store or "postgresql", f"postgresql: {err} during {during}")
    elif isinstance(err, (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)):
        failure = KVError(NOT_COMMITTED, f"postgresql conflict during {during}: {err}")
    elif isinstance(err, (pgerrors.LockNotAvailable, pgerrors.QueryCanceled, *_UNAVAILABLE)):
        failure = KVError(DATABASE_LOCKED, f"postgresql unavailable during {during}: {err}")
    else:
        failure = KVError(INTERNAL_ERROR, f"postgresql error during {during}: {err}")
    failure.__cause__ = err
    return failure


def commit_unknown(err: psycopg.Error) -> KVError:
    """COMMIT was sent and the connection failed before its answer: it may have committed."""
    failure = KVError(COMMIT_UNKNOWN_RESULT, f"postgresql COMMIT unanswered: {err}")
    failure.__cause__ = err
    return failure


@contextlib.contextmanager
def pipeline(conn: Any) -> Iterator[None]:
    """``conn.pipeline()`` that raises its statements' first error. psycopg raises an
    answer's error inside the block when it arrives while later statements are sent (a
    fast refusal, such as a serialization failure), then logs a warning that it ignored
    the pipeline's own abort on leaving it; here the block always ends normally, so the
    abort is raised and replaced by the error that caused it: nothing is logged."""
    first: psycopg.Error | None = None
    try:
        with conn.pipeline():
            try:
                yield
            except psycopg.Error as err:
                first = err
    except psycopg.Error as err:
        raise (first or err) from None
    if first is not None:
        raise first

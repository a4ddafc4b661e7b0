"""PostgreSQL's errors as storage errors, translated in one place."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from quickzones.backends.txnbuffer import INTERNAL_ERROR
from quickzones.errors import StorageError, StoreFull, StoreMisconfigured
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
    """A psycopg error as a storage error: a serialization failure or deadlock, or a
    prepared statement lost to a pooler, is a conflict (1020); an unreachable server or a
    lock wait past ``lock_timeout`` is retryable (1038); a full disk is
    :class:`StoreFull`; the rest is not retryable."""
    failure: StorageError
    if isinstance(err, pgerrors.DiskFull):
        failure = StoreFull(store or "postgresql", f"postgresql: {err} during {during}")
    elif isinstance(err, (pgerrors.SerializationFailure, pgerrors.DeadlockDetected)):
        failure = KVError(NOT_COMMITTED, f"postgresql conflict during {during}: {err}")
    elif isinstance(err, (pgerrors.InvalidSqlStatementName, pgerrors.DuplicatePreparedStatement)):
        # A prepared statement lost to a pooler (wire.py): nothing ran; the store's
        # statements go unprepared from now on, so the transaction's retry succeeds.
        failure = KVError(NOT_COMMITTED, f"postgresql: {err} during {during}; retrying unprepared")
    elif isinstance(err, (pgerrors.LockNotAvailable, pgerrors.QueryCanceled, *_UNAVAILABLE)):
        failure = KVError(DATABASE_LOCKED, f"postgresql unavailable during {during}: {err}")
    else:
        failure = KVError(INTERNAL_ERROR, f"postgresql error during {during}: {err}")
    failure.__cause__ = err
    return failure


# While no server answers, transactions try to connect at most once per this, doubling
# with each failure in a row up to the cap (see PostgresStore._next_try_at).
UNREACHABLE_PACE_S = 0.02
UNREACHABLE_PACE_CAP_S = 1.0


class ServerUnreachable(KVError):
    """A connection the server never answered (refused: nothing listens there; timed out;
    an unknown host): retryable like FDB's 1038 while the caller's timeout lasts, then
    given up as :class:`~quickzones.errors.StoreUnavailable` (``transaction.py``)."""

    def __init__(self, server: str, detail: str) -> None:
        super().__init__(
            DATABASE_LOCKED, f"cannot connect to the PostgreSQL server at {server}: {detail}"
        )
        self.server = server
        self.detail = detail


# What the server says when it refuses a connection for a while only (57P03, 53300):
# starting, stopping or recovering, or out of connection slots.
_TRANSIENT = (
    "starting up",
    "shutting down",
    "in recovery",
    "not yet accepting",
    "too many clients",
    "connection slots",
    "terminating connection",
)
_MISSING = re.compile(r'(database|role) "((?:[^"]|"")*)" does not exist')
# The server refused this role or the URL's database for good: authentication, pg_hba,
# no CONNECT privilege.
_DENIED = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied for database",
    "is not permitted to log in",
)


def _network_detail(text: str) -> str:
    """What libpq said about a connection no server answered, in a few words."""
    lowered = text.lower()
    if "connection refused" in lowered:
        return "connection refused: no server listens there"
    if "timeout expired" in lowered or "timed out" in lowered:
        return "the connection timed out"
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return "unknown host"
    last = text.strip().splitlines()[0] if text.strip() else "no answer"
    return last.split("failed: ")[-1]


def connect_failure(err: psycopg.Error, store: str, server: str) -> StorageError:
    """A failed connection attempt as a storage error: no server answered
    (:class:`ServerUnreachable`, retryable); the server refused what the URL names (a
    database or role that does not exist, authentication, no CONNECT privilege:
    :class:`StoreMisconfigured`, not retryable); else as :func:`translate` says (a server
    starting or out of connection slots is retryable). libpq reports a refusal during
    connection startup as text only (no SQLSTATE), so the server's English message is
    read; one in another language stays retryable, as before."""
    text = str(err)
    if "FATAL:" not in text:
        failure: StorageError = ServerUnreachable(server, _network_detail(text))
    else:
        fatal = text.split("FATAL:", 1)[1].strip().splitlines()[0].strip()
        missing = _MISSING.search(fatal)
        if missing is not None and not any(t in fatal for t in _TRANSIENT):
            kind, name = missing.group(1), missing.group(2)
            fix = (
                "create it (CREATE DATABASE) or fix the database in the URL's path"
                if kind == "database"
                else "create it (CREATE ROLE ... LOGIN) or fix the user in the URL"
            )
            failure = StoreMisconfigured(
                store, f'{kind} "{name}" does not exist on the PostgreSQL server at {server}: {fix}'
            )
        elif any(d in fatal for d in _DENIED):
            failure = StoreMisconfigured(
                store, f"the PostgreSQL server at {server} refused the connection: {fatal}"
            )
        else:
            return translate(err, "connect", store)
    failure.__cause__ = err
    return failure


class CommitUnanswered(KVError):
    """``commit_unknown_result`` from a COMMIT whose answer was lost. ``log_row``: what
    the commit wrote into its ``quick_log`` row (the client's clock in us, its write
    ranges' begins and ends), by which the store can learn whether it committed; None
    when it wrote none."""

    log_row: tuple[int, list[bytes], list[bytes]] | None


def commit_unknown(
    err: psycopg.Error, log_row: tuple[int, list[bytes], list[bytes]] | None
) -> KVError:
    """COMMIT was sent and the connection failed before its answer: it may have committed."""
    failure = CommitUnanswered(COMMIT_UNKNOWN_RESULT, f"postgresql COMMIT unanswered: {err}")
    failure.log_row = log_row
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

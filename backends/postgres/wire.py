"""Statements sent straight through libpq's pipeline mode, their parameters encoded here in
binary (issue 42: a plain enqueue's client CPU was mostly psycopg's parameter dumping and
its per-statement pipeline loop, 1.09 ms a call against 0.37 for procrastinate's defer).

Used on quick's own connections and on an application's blocking psycopg connection for
quick's reads and commits, whose parameters are only a few kinds (bytea and its arrays,
int4/int8, int4[] and bool[], and text): each is packed with :mod:`struct` in PostgreSQL's
binary format, and all the statements of one round trip go out in one write and one
``Sync``, their answers read in one pass. Results come as bytes: binary for key-value
rows (``bytea`` needs no unescaping), text for the rest.

On a store's own connections (:func:`enroll`) each statement with parameters is prepared
once per connection, in the round trip of its first use: an unnamed statement is parsed
and planned on every call, which cost a plain enqueue about 150 us of the server's CPU (a
fifth of it). Behind a pooler in transaction mode (PgBouncer before 1.21) a prepared
statement does not follow the connection to the next server session: the first statement
that finds its name unknown, or taken, turns preparing off for that store for good (said
once in the log) and fails retryably, or, where the statement comes after the commit in
its round trip (``soft_from``), comes back without rows and raises nothing.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import generators, pq
from psycopg.abc import PQGen
from psycopg.errors import error_from_result

# A parameter: (type oid, value or None for NULL, format: 1 binary, 0 text).
Param = tuple[int, bytes | None, int]

_ARRAY_HEAD = struct.Struct(">iiIii")  # ndim, has nulls, element oid, length, lower bound
_INT4 = struct.Struct(">i")
_NULL_ELEMENT = _INT4.pack(-1)  # an array element that is NULL
_INT8 = struct.Struct(">q")
_BYTEA, _INT4_OID, _INT8_OID, _BOOL, _TEXT = 17, 23, 20, 16, 25
_BYTEA_ARRAY, _INT4_ARRAY, _BOOL_ARRAY, _TEXT_ARRAY = 1001, 1007, 1000, 1009
_INT8_ARRAY = 1016
_INT8_ELEMENT = struct.Struct(">iq")  # an int8 array element: its length (8), its value
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
NULL: Param = (0, None, 0)

log = logging.getLogger("quick.postgres")

# A prepared statement this server session does not know (26000), or a name it has already
# (42P05): the connection reaches another session than the one it prepared on (a pooler).
LOST_PREPARED = frozenset({"26000", "42P05"})
# A statement of more parameters goes unprepared: the native zones' batches (a dequeue's
# leases, a flush of completions, a round of part twos) are a statement per batch size,
# and each size prepared on every connection would be kept by the server for the
# connection's life; a big batch's planning is shared by its rows anyway.
PREPARED_PARAMS_MAX = 32


class Preparing:
    """Whether one store's own connections prepare their statements: on until a server
    session behind them turns out not to be the one they prepared on."""

    def __init__(self, on: bool, shown: str) -> None:
        self.on = on
        self.shown = shown
        self._lock = threading.Lock()  # several threads may find it out at once: said once

    def refused(self, err: psycopg.Error) -> None:
        with self._lock:
            was, self.on = self.on, False
        if was:
            log.warning(
                "postgresql store %s: a prepared statement did not follow its connection"
                " (%s; a pooler in transaction mode, such as PgBouncer before 1.21?):"
                " statements go unprepared from now on",
                self.shown,
                str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__,
            )


class _Prepared:
    """What one connection prepared: names by (text, parameter types)."""

    __slots__ = ("made", "names", "prefix", "preparing")

    def __init__(self, preparing: Preparing) -> None:
        self.preparing = preparing
        self.names: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        # Names no other connection uses: behind a pooler a server session holds other
        # clients' statements too, and one of the same name and parameters would run in
        # place of ours. Never reused, so a failed Prepare cannot collide later either.
        self.prefix = b"quick_" + os.urandom(8).hex().encode() + b"_"
        self.made = 0

    def name(self) -> bytes:
        self.made += 1
        return self.prefix + b"%d" % self.made


_prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Prepared] = (
    weakref.WeakKeyDictionary()
)


def enroll(conn: psycopg.Connection[Any], preparing: Preparing) -> None:
    """Prepare ``conn``'s statements from now on, while ``preparing`` is on (a store's
    own connection; never an application's, whose session is the application's)."""
    _prepared[conn] = _Prepared(preparing)


def bytea(value: bytes) -> Param:
    return (_BYTEA, value, 1)


def byteas(values: Sequence[bytes | None] | None) -> Param:
    """A ``bytea[]`` (None or empty: NULL, which quick's statements read as none); an
    element None is a NULL element."""
    if not values:
        return (_BYTEA_ARRAY, None, 1)
    pack = _INT4.pack
    parts = [_ARRAY_HEAD.pack(1, 0, _BYTEA, len(values), 1)]
    for value in values:
        if value is None:
            parts.append(_NULL_ELEMENT)
            continue
        parts.append(pack(len(value)))
        parts.append(value)
    return (_BYTEA_ARRAY, b"".join(parts), 1)


def int4s(values: Sequence[int] | None) -> Param:
    if not values:
        return (_INT4_ARRAY, None, 1)
    body = struct.pack(f">{2 * len(values)}i", *(x for v in values for x in (4, v)))
    return (_INT4_ARRAY, _ARRAY_HEAD.pack(1, 0, _INT4_OID, len(values), 1) + body, 1)


def int8s(values: Sequence[int] | None) -> Param:
    if not values:
        return (_INT8_ARRAY, None, 1)
    body = b"".join(_INT8_ELEMENT.pack(8, v) for v in values)
    return (_INT8_ARRAY, _ARRAY_HEAD.pack(1, 0, _INT8_OID, len(values), 1) + body, 1)


def bools(values: Sequence[bool] | None) -> Param:
    if not values:
        return (_BOOL_ARRAY, None, 1)
    body = b"".join(b"\x00\x00\x00\x01\x01" if v else b"\x00\x00\x00\x01\x00" for v in values)
    return (_BOOL_ARRAY, _ARRAY_HEAD.pack(1, 0, _BOOL, len(values), 1) + body, 1)


def texts(values: Sequence[str]) -> Param:
    """A ``text[]``."""
    pack = _INT4.pack
    parts = [_ARRAY_HEAD.pack(1, 0, _TEXT, len(values), 1)]
    for value in values:
        encoded = value.encode()
        parts.append(pack(len(encoded)))
        parts.append(encoded)
    return (_TEXT_ARRAY, b"".join(parts), 1)


def int4(value: int) -> Param:
    return (_INT4_OID, _INT4.pack(value), 1)


def int8(value: int | None) -> Param:
    return (_INT8_OID, None if value is None else _INT8.pack(value), 1)


def text(value: str | None) -> Param:
    """Text the statement casts itself (``$1::pg_snapshot``): sent untyped, as text."""
    return (0, None if value is None else value.encode(), 0)


class Rows:
    """One statement's rows as tuples of bytes (None for NULL), read from its result;
    ``failed`` when the statement did not run (past ``soft_from``, see :func:`exchange`)."""

    def __init__(self, result: pq.abc.PGresult | None, failed: bool = False) -> None:
        self.failed = failed
        # Each column's type oid, and how many rows the statement wrote or returned.
        self.types: list[int] = []
        self.rowcount = 0
        if result is None:  # a statement skipped after an error, or one without rows
            self._rows: list[tuple[Any, ...]] = []
            return
        get = result.get_value
        columns = range(result.nfields)
        self._rows = [tuple(get(r, c) for c in columns) for r in range(result.ntuples)]
        self.types = [result.ftype(c) for c in columns]
        self.rowcount = result.command_tuples or 0

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


def ints(array: bytes) -> list[int]:
    """The elements of an integer array in text (``{1,2,3}``)."""
    return [int(x) for x in array[1:-1].split(b",") if x]


# One statement of a round trip: its text (``$n`` placeholders), its parameters, and
# whether its rows come in binary (key-value rows) or text.
Statement = tuple[bytes, Sequence[Param], bool]


def plain(sql: str) -> Statement:
    """A statement without parameters (BEGIN, COMMIT, SAVEPOINT ...), answered in text."""
    return (sql.encode(), (), False)


def usable(conn: object) -> bool:
    """Whether ``conn`` is a blocking psycopg connection this module may drive: not inside
    a psycopg pipeline of its own (its libpq connection would be in pipeline mode
    already), nor an application's asyncio connection (driven from its event loop)."""
    return isinstance(conn, psycopg.Connection) and getattr(conn, "_pipeline", None) is None


def exchange(
    conn: psycopg.Connection[Any],
    statements: Sequence[Statement],
    soft_from: int | None = None,
) -> list[Rows]:
    """Send ``statements`` in one pipeline (one write, one ``Sync``) and read their
    answers: their rows, in order. The first error the server answered is raised (a
    psycopg error with its SQLSTATE, as ``conn.execute`` raises it; the statements after
    it were skipped by the server); a connection lost meanwhile raises psycopg's
    ``OperationalError`` and is left broken. A prepared statement lost to a pooler at or
    past index ``soft_from`` (statements after a COMMIT, whose failure must not read as
    the commit's) is not raised: those statements come back ``failed``."""
    pgconn = conn.pgconn
    entry = _prepared.get(conn)
    names = entry.names if entry is not None and entry.preparing.on else None
    # Per statement, the (text, types) key of a Prepare sent before it, if one was.
    fresh: list[tuple[bytes, tuple[int, ...]] | None] = []
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            for sql, params, binary in statements:
                if not params and (names is None or not sql.startswith(b"SELECT")):
                    # BEGIN, COMMIT and the like take no planning: nothing to keep.
                    fresh.append(None)
                    pgconn.send_query_params(sql, None, result_format=1 if binary else 0)
                    continue
                values = [p[1] for p in params]
                formats = [p[2] for p in params]
                if names is None or len(params) > PREPARED_PARAMS_MAX:
                    fresh.append(None)
                    pgconn.send_query_params(
                        sql, values, [p[0] for p in params], formats, 1 if binary else 0
                    )
                    continue
                key = (sql, tuple(p[0] for p in params))
                name = names.get(key)
                if name is None:
                    assert entry is not None
                    # Dropped again below unless the Prepare succeeds.
                    name = names[key] = entry.name()
                    fresh.append(key)
                    pgconn.send_prepare(name, sql, list(key[1]))
                else:
                    fresh.append(None)
                pgconn.send_query_prepared(name, values, formats, 1 if binary else 0)
            pgconn.pipeline_sync()
            count = len(statements) + sum(1 for k in fresh if k is not None)
            answers = conn.wait(_answers(pgconn, count))
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Whatever libpq holds of this exchange cannot be told apart from the next
            # one's answers: the connection is not used again, and stays ``broken`` (not
            # closed cleanly), so a commit that may have reached the server says so.
            if names is not None:
                for made in fresh:
                    if made is not None:
                        names.pop(made, None)
            if pgconn.status != pq.ConnStatus.BAD:
                pgconn.finish()
            raise
    out: list[Rows] = []
    failed: psycopg.Error | None = None
    failed_at = -1
    at = 0
    for index, made in enumerate(fresh):
        if made is not None:
            prepared = answers[at]
            at += 1
            if not prepared or prepared[-1].status != pq.ExecStatus.COMMAND_OK:
                assert names is not None
                names.pop(made, None)  # not prepared: the next use prepares it again
                for result in prepared:
                    if result.status == pq.ExecStatus.FATAL_ERROR and failed is None:
                        failed = error_from_result(result, encoding=conn.info.encoding)
                        failed_at = index
        results = answers[at]
        at += 1
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR and failed is None:
                failed = error_from_result(result, encoding=conn.info.encoding)
                failed_at = index
        last = results[-1] if results else None
        rows = last if last is not None and last.status in _OK else None
        out.append(Rows(rows, failed=failed is not None and index >= failed_at >= 0))
    if failed is not None:
        if entry is not None and failed.sqlstate in LOST_PREPARED:
            entry.preparing.refused(failed)
            entry.names.clear()
            if soft_from is not None and failed_at >= soft_from:
                return out
        raise failed
    return out


def _answers(pgconn: pq.abc.PGconn, count: int) -> PQGen[list[list[Any]]]:
    """Flush the pipeline, then read each statement's results and the ``Sync``'s."""
    yield from generators.send(pgconn)
    answers = []
    for _ in range(count):
        answers.append((yield from generators.fetch_many(pgconn)))
    while True:  # up to and including the Sync's answer
        results = yield from generators.fetch_many(pgconn)
        if not results or results[0].status == pq.ExecStatus.PIPELINE_SYNC:
            break
    return answers

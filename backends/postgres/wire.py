"""Statements sent straight through libpq's pipeline mode, their parameters encoded here in
binary (issue 42: a plain enqueue's client CPU was mostly psycopg's parameter dumping and
its per-statement pipeline loop, 1.09 ms a call against 0.37 for procrastinate's defer).

Used on quick's own connections and on an application's blocking psycopg connection for
quick's reads and commits, whose parameters are only a few kinds (bytea and its arrays,
int4/int8, int4[] and bool[], and text): each is packed with :mod:`struct` in PostgreSQL's
binary format, and all the statements of one round trip go out in one write and one
``Sync``, their answers read in one pass. Nothing is prepared on the server (behind
PgBouncer before 1.21 a prepared statement does not follow the next transaction to
another server session). Results come as bytes: binary for key-value rows (``bytea``
needs no unescaping), text for the rest.
"""

from __future__ import annotations

import struct
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
_INT8 = struct.Struct(">q")
_BYTEA, _INT4_OID, _INT8_OID, _BOOL, _TEXT = 17, 23, 20, 16, 25
_BYTEA_ARRAY, _INT4_ARRAY, _BOOL_ARRAY, _TEXT_ARRAY = 1001, 1007, 1000, 1009
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
NULL: Param = (0, None, 0)


def bytea(value: bytes) -> Param:
    return (_BYTEA, value, 1)


def byteas(values: Sequence[bytes] | None) -> Param:
    """A ``bytea[]`` (None or empty: NULL, which quick's statements read as none)."""
    if not values:
        return (_BYTEA_ARRAY, None, 1)
    pack = _INT4.pack
    parts = [_ARRAY_HEAD.pack(1, 0, _BYTEA, len(values), 1)]
    for value in values:
        parts.append(pack(len(value)))
        parts.append(value)
    return (_BYTEA_ARRAY, b"".join(parts), 1)


def int4s(values: Sequence[int] | None) -> Param:
    if not values:
        return (_INT4_ARRAY, None, 1)
    body = struct.pack(f">{2 * len(values)}i", *(x for v in values for x in (4, v)))
    return (_INT4_ARRAY, _ARRAY_HEAD.pack(1, 0, _INT4_OID, len(values), 1) + body, 1)


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
    """One statement's rows as tuples of bytes (None for NULL), read from its result."""

    def __init__(self, result: pq.abc.PGresult | None) -> None:
        if result is None:  # a statement skipped after an error, or one without rows
            self._rows: list[tuple[Any, ...]] = []
            return
        get = result.get_value
        columns = range(result.nfields)
        self._rows = [tuple(get(r, c) for c in columns) for r in range(result.ntuples)]

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


def exchange(conn: psycopg.Connection[Any], statements: Sequence[Statement]) -> list[Rows]:
    """Send ``statements`` in one pipeline (one write, one ``Sync``) and read their
    answers: their rows, in order. The first error the server answered is raised (a
    psycopg error with its SQLSTATE, as ``conn.execute`` raises it; the statements after
    it were skipped by the server); a connection lost meanwhile raises psycopg's
    ``OperationalError`` and is left broken."""
    pgconn = conn.pgconn
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            for sql, params, binary in statements:
                if params:
                    pgconn.send_query_params(
                        sql,
                        [p[1] for p in params],
                        [p[0] for p in params],
                        [p[2] for p in params],
                        1 if binary else 0,
                    )
                else:
                    pgconn.send_query_params(sql, None, result_format=1 if binary else 0)
            pgconn.pipeline_sync()
            answers = conn.wait(_answers(pgconn, len(statements)))
            pgconn.exit_pipeline_mode()
        except BaseException:
            # Whatever libpq holds of this exchange cannot be told apart from the next
            # one's answers: the connection is not used again, and stays ``broken`` (not
            # closed cleanly), so a commit that may have reached the server says so.
            if pgconn.status != pq.ConnStatus.BAD:
                pgconn.finish()
            raise
    out: list[Rows] = []
    failed: psycopg.Error | None = None
    for results in answers:
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR and failed is None:
                failed = error_from_result(result, encoding=conn.info.encoding)
        last = results[-1] if results else None
        out.append(Rows(last if last is not None and last.status in _OK else None))
    if failed is not None:
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

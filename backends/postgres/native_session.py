"""The native zones' statements (``quick_core/store/sql``) on a store's own connection,
through :mod:`wire`: each prepared once per connection under the store's own names (safe
behind a pooler, turned off where one loses them, as the KV layout's statements are), its
parameters packed in binary, and the statements of a block sent together until the block
reads one's rows (as psycopg's pipeline would send them).

Sent unprepared through psycopg, every native statement was parsed and planned on each
call: on issue 42's long-transaction flow (500 items/s, ``quick worker --workers 4``) the
2-core host's server fell behind and the backlog grew by 100-200 items a second; prepared,
it stayed at 0 (docs/backends.md, "Zones native in SQL").

Statements keep psycopg's notation (``%(name)s``, ``%s``, ``%%``); a Python ``int`` goes
as ``bigint``, ``bytes`` as ``bytea``, ``bool`` as ``boolean``, ``str`` and ``None``
untyped (the server infers their type from the statement, as psycopg sends them). Rows
come back in binary, each value as Python reads it from psycopg."""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg

from quickzones.backends.postgres import wire

_PLACEHOLDER = re.compile(r"%%|%\((\w+)\)s|%s")
_INT2, _INT4, _INT8 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_OID, _XID8 = struct.Struct(">I"), struct.Struct(">Q")
_FLOAT4, _FLOAT8 = struct.Struct(">f"), struct.Struct(">d")


def _text(raw: bytes) -> str:
    return raw.decode()


# A binary value as Python reads it, by the column's type oid.
_READ: dict[int, Callable[[bytes], Any]] = {
    16: lambda raw: raw == b"\x01",  # boolean
    17: bytes,  # bytea
    18: _text,  # "char"
    19: _text,  # name
    20: lambda raw: _INT8.unpack(raw)[0],
    21: lambda raw: _INT2.unpack(raw)[0],
    23: lambda raw: _INT4.unpack(raw)[0],
    25: _text,
    26: lambda raw: _OID.unpack(raw)[0],
    700: lambda raw: _FLOAT4.unpack(raw)[0],
    701: lambda raw: _FLOAT8.unpack(raw)[0],
    1043: _text,  # varchar
    2278: lambda raw: None,  # void (pg_notify's)
    5069: lambda raw: _XID8.unpack(raw)[0],
}


@functools.lru_cache(maxsize=1024)
def _numbered(query: str) -> tuple[bytes, tuple[str, ...], int]:
    """``query`` with ``$n`` placeholders, the parameter names in their order (one ``$n``
    a name, however often it appears), and the count of positional ``%s``."""
    names: dict[str, int] = {}
    positional = 0

    def number(match: re.Match[str]) -> str:
        nonlocal positional
        if match.group(0) == "%%":
            return "%"
        name = match.group(1)
        if name is None:
            positional += 1
            return f"${positional}"
        if name not in names:
            names[name] = len(names) + 1
        return f"${names[name]}"

    text = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise ValueError(f"a statement mixes named and positional parameters: {query!r}")
    return text.encode(), tuple(names), positional


def _param(value: Any) -> wire.Param:
    if value is None:
        return wire.NULL
    if isinstance(value, bool):
        return (16, b"\x01" if value else b"\x00", 1)
    if isinstance(value, int):
        return wire.int8(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return wire.bytea(bytes(value))
    if isinstance(value, str):
        return wire.text(value)
    raise TypeError(f"no binary form here for a parameter of type {type(value).__name__}")


def statement(query: str, params: Mapping[str, Any] | Sequence[Any] | None) -> wire.Statement:
    """``query`` and ``params`` as one statement of a :func:`wire.exchange`."""
    text, names, positional = _numbered(query)
    if names:
        if not isinstance(params, Mapping):
            raise TypeError(f"named parameters need a mapping: {query!r}")
        values: Sequence[Any] = [params[name] for name in names]
    elif positional:
        if params is None or isinstance(params, Mapping) or len(params) != positional:
            raise TypeError(f"{positional} positional parameters expected: {query!r}")
        values = params
    else:
        values = ()
    return (text, [_param(v) for v in values], True)


class Result:
    """One statement's answer, read once the session has sent it."""

    __slots__ = ("_error", "_rows", "_session", "rowcount")

    def __init__(self, session: WireSession) -> None:
        self._session: WireSession | None = session
        self._rows: list[tuple[Any, ...]] = []
        self._error: BaseException | None = None

    def _answered(self, rows: wire.Rows) -> None:
        self._session = None
        reads = [_READ.get(t) for t in rows.types]
        out = []
        for row in rows.fetchall():
            values: list[Any] = []
            for read, raw in zip(reads, row, strict=True):
                if raw is None:
                    values.append(None)
                elif read is None:
                    raise TypeError(f"no reader here for a column of type oids {rows.types}")
                else:
                    values.append(read(raw))
            out.append(tuple(values))
        self._rows = out
        self.rowcount = rows.rowcount

    def _failed(self, error: BaseException) -> None:
        self._session = None
        self._error = error

    def _wait(self) -> None:
        if self._session is not None:
            self._session.flush()
        if self._error is not None:
            raise self._error

    def __getattr__(self, name: str) -> Any:  # rowcount, before the statement was sent
        if name == "rowcount":
            self._wait()
            return self.rowcount
        raise AttributeError(name)

    def fetchone(self) -> tuple[Any, ...] | None:
        self._wait()
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._wait()
        return self._rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        self._wait()
        return iter(self._rows)


class WireSession:
    """A store's own connection as the native zones use it (``execute``): statements wait
    to be sent until one's rows are read, or :meth:`flush`, then go in one round trip."""

    __slots__ = ("_queued", "conn")
    sends_later = True  # SQLTransaction.sends_later

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._queued: list[tuple[wire.Statement, Result]] = []

    def execute(
        self, query: str, params: Mapping[str, Any] | Sequence[Any] | None = None
    ) -> Result:
        result = Result(self)
        self._queued.append((statement(query, params), result))
        return result

    def flush(self) -> None:
        """Send what waits, in one round trip; raises the first error the server
        answered (psycopg's, with its SQLSTATE), which every unanswered result raises."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        try:
            answers = wire.exchange(self.conn, [s for s, _ in queued])
        except BaseException as err:
            for _, result in queued:
                result._failed(err)
            raise
        for (_, result), rows in zip(queued, answers, strict=True):
            result._answered(rows)

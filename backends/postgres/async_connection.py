"""An application's psycopg ``AsyncConnection`` seen as the blocking connection quick's
application transaction writes through (``AsyncQuick.enqueue_on``): the enqueue runs on a
worker thread, and each statement is run on the event loop that owns the connection, which
is free meanwhile (it awaits that thread). Only what :mod:`.app_transaction` and
:mod:`.resolver` use is here; results are fetched whole (a few rows each)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql

T = TypeVar("T")


class _Rows:
    """A statement's rows, fetched on the loop."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows


class SyncOverAsync:
    """The blocking face of ``connection``, driven on ``loop``."""

    def __init__(
        self, connection: psycopg.AsyncConnection[tuple[Any, ...]], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._conn = connection
        self._loop = loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def info(self) -> Any:
        return self._conn.info

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def broken(self) -> bool:
        return self._conn.broken

    @property
    def autocommit(self) -> bool:
        return self._conn.autocommit

    def execute(
        self,
        query: str | sql.Composed,
        params: Sequence[Any] | None = None,
        *,
        prepare: bool | None = None,
    ) -> _Rows:
        async def run() -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(query, params, prepare=prepare)
            return await cur.fetchall() if cur.description is not None else []

        return _Rows(self._run(run()))

    def executemany(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        async def run() -> None:
            async with self._conn.cursor() as cur:
                await cur.executemany(query, params)

        self._run(run())

    @contextlib.contextmanager
    def cursor(self) -> Iterator[SyncOverAsync]:
        yield self

    @contextlib.contextmanager
    def pipeline(self) -> Iterator[None]:
        # Statements go one by one: each already waits for its answer on the loop.
        yield

    @contextlib.contextmanager
    def transaction(self, savepoint_name: str) -> Iterator[None]:
        name = sql.Identifier(savepoint_name)
        self.execute(sql.SQL("SAVEPOINT {}").format(name))
        try:
            yield
        except BaseException:
            if not self._conn.broken:
                self.execute(sql.SQL("ROLLBACK TO SAVEPOINT {}").format(name))
                self.execute(sql.SQL("RELEASE SAVEPOINT {}").format(name))
            raise
        self.execute(sql.SQL("RELEASE SAVEPOINT {}").format(name))

"""The storage half's connection for backends that read through a pooled database
connection (SQLite, PostgreSQL): taken from the store's pool when the transaction takes
its read version, held with its snapshot until the commit or a reset, given back to the
pool after, and given back when an abandoned transaction is collected, so a forgotten
transaction never pins its snapshot (a SQLite WAL snapshot, a PostgreSQL REPEATABLE READ
one) or its connection for ever."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from quickzones.backends.txnbuffer.transaction import BufferedTransaction
from quickzones.clock import Clock

C = TypeVar("C")


class ConnectionPool(Protocol[C]):
    """What a pooled transaction needs of its store."""

    @property
    def clock(self) -> Clock: ...

    def _acquire(self) -> C: ...

    def _release(self, conn: C) -> None: ...

    def _random(self) -> float: ...


class PooledTransaction(BufferedTransaction, Generic[C]):
    """A buffered transaction holding the pool's connection ``C`` while it reads."""

    def __init__(self, pool: ConnectionPool[C]) -> None:
        self._pool = pool
        self._conn: C | None = None
        super().__init__(pool.clock)

    def _snapshot(self) -> C:
        """The connection holding the read snapshot (a read past the 5 s lifetime is
        ``transaction_too_old``)."""
        assert self._conn is not None, "read before the read version was acquired"
        self._check_too_old(self._now())
        return self._conn

    def _take_connection(self) -> C:
        """The connection for the commit: the snapshot's, or a fresh one from the pool
        (a transaction that only writes); the caller releases it to the pool."""
        conn, self._conn = self._conn, None
        return conn if conn is not None else self._pool._acquire()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._release(conn)

    def _random(self) -> float:
        return self._pool._random()

    def __del__(self) -> None:
        # Runs for every transaction (each enqueue's): a try costs less than a suppress().
        try:
            self._release()
        except Exception:  # a collected transaction has no one to tell
            pass

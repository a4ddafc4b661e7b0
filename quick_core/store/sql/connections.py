"""The seam under the native SQL zones: a store that runs SQL statements of its own
(``sqlite:///...?zones=sql``: :class:`quickzones.backends.sqlite.native.NativeTransactions`).
The zones hold a DB-API connection only inside these blocks and import no driver."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


class SQLConnections(Protocol):
    """Where the native SQL zones' statements run."""

    # The statements' dialect ("sqlite", "postgres") and the prefix of the tables' names
    # (a quoted schema and a dot, or nothing).
    sql_dialect: str
    sql_namespace: str

    def sql_write(self) -> AbstractContextManager[Any]:
        """A DB-API connection in a write transaction for the block: what the block ran
        commits when it ends and nothing when it raises; errors come back as the store's
        (:class:`~quickzones.errors.StorageError`, ``KVError``). On SQLite the block holds
        the file's write lock from its start; on PostgreSQL (READ COMMITTED) each row is
        locked by the statement that writes it, or a ``FOR UPDATE``, and the statements
        are pipelined: a block reads what a statement did from the rows it returns
        (``RETURNING``), never from a cursor's ``rowcount``, which is not known yet."""
        ...

    def sql_write_one(self) -> AbstractContextManager[Any]:
        """A DB-API connection whose write statements each commit on their own (where a
        transaction costs round trips: PostgreSQL's autocommit), for blocks of statements
        that need nothing in common but the connection."""
        ...

    def signal_commit(self, conn: Any) -> None:
        """Inside :meth:`sql_write`'s block: idle consumers of other processes wake for
        this commit (an enqueue that made or pulled a pointer)."""
        ...

    def sql_read(self) -> AbstractContextManager[Any]:
        """A DB-API connection whose statements each read a snapshot of their own."""
        ...


class SQLTransaction:
    """A native write transaction handed to the callbacks that a pointer's requeue or
    collection runs inside it (the zone's next vesting time, its emptiness), where the KV
    top-level queue hands its KV transaction: the zone store reads through the same
    connection, under the same lock."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

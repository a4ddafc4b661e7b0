"""The seam under the native SQL zones: a store that runs SQL statements of its own
(``sqlite:///...?zones=sql``: :class:`quickzones.backends.sqlite.native.NativeTransactions`).
The zones hold a DB-API connection only inside these blocks and import no driver."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from quickzones.store.kv import KVError, KVStore, run

T = TypeVar("T")

_log = logging.getLogger("quick.sql")


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

    def sql_schema(self) -> AbstractContextManager[Any]:
        """As :meth:`sql_write`, holding the store's schema lock for the block, which
        processes creating or migrating the store's tables take one at a time."""
        ...

    def sql_write_one(self) -> AbstractContextManager[Any]:
        """A DB-API connection whose write statements each commit on their own (where a
        transaction costs round trips: PostgreSQL's autocommit), for blocks of statements
        that need nothing in common but the connection."""
        ...

    def relax_durability(self, conn: Any) -> None:
        """Inside :meth:`sql_write`'s block: its commit need not wait for the server's
        log flush (:func:`quickzones.store.kv.relax_durability`; PostgreSQL's
        ``synchronous_commit = off`` for this transaction; elsewhere nothing)."""
        ...

    def signal_commit(self, conn: Any) -> None:
        """Inside :meth:`sql_write`'s block: idle consumers of other processes wake for
        this commit (an enqueue that made or pulled a pointer)."""
        ...

    def sql_read(self) -> AbstractContextManager[Any]:
        """A DB-API connection whose statements each read a snapshot of their own."""
        ...


def retrying(kv: KVStore, work: Callable[[], T]) -> T:
    """``work()`` (native statements in a transaction of their own), run again after a
    retryable error (a connection lost, a server restarting, a deadlock) as
    :func:`~quickzones.store.kv.run` runs a KV transaction again: with its backoff,
    within the store's retry limit and timeout, :class:`RetryLimitExceeded` past them.
    The first attempt costs nothing more than the call; ``work`` must be idempotent."""
    try:
        return work()
    except KVError as err:
        if not err.retryable:
            raise
    # The KV transaction run() makes carries its backoff and bounds; nothing is written
    # through it, so its commit is empty.
    return run(kv, lambda tr: work())


class SQLTransaction:
    """A native write transaction handed to the code that runs inside it where the KV
    top-level queue hands its KV transaction: a pointer's requeue or collection (the
    zone's next vesting time, its emptiness) and a one-transaction visit (the pointer's
    lease, the dequeue, the requeue). The zone store reads and writes through the same
    connection, under the same locks. Work that must not run inside it (a dead letter,
    written in a KV transaction, which on SQLite would wait for this transaction's write
    lock) is handed to :meth:`after_commit`."""

    __slots__ = ("_after", "_sql", "ahead", "app_txid", "conn")
    # Not a KV transaction: code above the seam that would read KV records inside one
    # reads them in a transaction of their own instead (quickzones.consumer.fetcher).
    native = True

    def __init__(self, conn: Any, sql: SQLConnections | None = None) -> None:
        self.conn = conn
        self._sql = sql
        self._after: list[Callable[[], None]] = []
        # An application's transaction (``Quick.enqueue_on``): its id, where a statement
        # asked the server for it, for the store to run :meth:`after_commit`'s work once
        # that transaction has committed.
        self.app_txid: str | None = None
        # Statements a visit sent ahead of the calls that read their answers, by what
        # they read (:meth:`sends_later`): those calls take them from here.
        self.ahead: dict[tuple[str, Any], Any] = {}

    def sends_later(self) -> bool:
        """Whether this transaction's statements wait to be sent until an answer is read
        (PostgreSQL's native session): a visit then sends its first reads together, one
        round trip for all of them, where each was a round trip of its own."""
        return bool(getattr(self.conn, "sends_later", False))

    def relax_durability(self) -> None:
        """See :func:`quickzones.store.kv.relax_durability` (a visit's writes)."""
        if self._sql is not None:
            self._sql.relax_durability(self.conn)

    def after_commit(self, work: Callable[[], None]) -> None:
        """Run ``work`` once this transaction has committed (never if it does not)."""
        self._after.append(work)

    def take_after(self) -> list[Callable[[], None]]:
        """The work handed to :meth:`after_commit`, for whoever runs it once the
        transaction has committed (an application's: the store, which sees its COMMIT)."""
        after, self._after = self._after, []
        return after

    def committed(self) -> None:
        """Called by whoever committed it: the work handed to :meth:`after_commit`, each
        on its own; one that fails is logged and the rest still run (what it was to do,
        a dead letter, is found again by the zone's next visit), never raised to the
        caller, whose transaction did commit."""
        for work in self.take_after():
            try:
                work()
            except Exception:
                _log.warning("work after a native commit failed; the next visit retries it",
                             exc_info=True)  # fmt: skip

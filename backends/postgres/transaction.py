"""A transaction on a PostgreSQL store: the storage half of a buffered transaction, read
from a REPEATABLE READ snapshot and committed through the resolver."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psycopg
from psycopg.pq import TransactionStatus

from quickzones.backends.postgres import resolver
from quickzones.backends.postgres.errors import pipeline, translate
from quickzones.backends.postgres.sql import KEYS_PER_SELECT
from quickzones.backends.txnbuffer import CommitRequest, KeyValue
from quickzones.backends.txnbuffer.pooled import PooledTransaction

if TYPE_CHECKING:
    from quickzones.backends.postgres.store import PostgresStore


class PostgresTransaction(PooledTransaction[resolver.Connection]):
    """A transaction on a :class:`PostgresStore`; holds a pooled connection (and its
    snapshot) from its first read until it commits or is reset."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        super().__init__(store)

    def _acquire_read_version(self) -> int:
        store = self._store
        conn = store._acquire()
        try:
            # The snapshot is taken by the first statement, which reads the version: the
            # data every later read sees is exactly that version's (commits bump it under
            # the resolver's lock, in the transaction that writes). One round trip.
            with pipeline(conn):
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur = conn.execute(store.sql.version)
            row = cur.fetchone()
        except psycopg.Error as err:
            store._release(conn)
            raise translate(err, "read version", store.shown) from err
        self._conn = conn
        assert row is not None
        return int(row[0])

    def _read_key(self, key: bytes) -> bytes | None:
        conn = self._snapshot()
        try:
            row = conn.execute(self._store.sql.get, (key,)).fetchone()
        except psycopg.Error as err:
            raise translate(err, "get", self._store.shown) from err
        return None if row is None else bytes(row[0])

    def _read_keys(self, keys: Sequence[bytes]) -> list[bytes | None]:
        conn = self._snapshot()
        found: dict[bytes, bytes] = {}
        try:
            for at in range(0, len(keys), KEYS_PER_SELECT):
                chunk = list(keys[at : at + KEYS_PER_SELECT])
                rows = conn.execute(self._store.sql.get_many, (chunk,)).fetchall()
                found.update((bytes(k), bytes(v)) for k, v in rows)
        except psycopg.Error as err:
            raise translate(err, "get_many", self._store.shown) from err
        return [found.get(key) for key in keys]

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        conn = self._snapshot()
        sql = self._store.sql.range_reverse if reverse else self._store.sql.range
        try:
            rows = conn.execute(sql + " LIMIT %s", (begin, end, limit or None)).fetchall()
        except psycopg.Error as err:
            raise translate(err, "get_range", self._store.shown) from err
        return [(bytes(k), bytes(v)) for k, v in rows]

    def _commit_request(self, request: CommitRequest) -> tuple[int, int]:
        store = self._store
        store.check_not_held_here()
        conn = self._take_connection()
        # End the snapshot (the resolver reads the newest state) and open the commit's
        # READ COMMITTED transaction in the round trip that takes the lock.
        reading = conn.info.transaction_status != TransactionStatus.IDLE
        begin = ("COMMIT", "BEGIN") if reading else ("BEGIN",)
        now = self._clock.now()
        try:
            try:
                version = resolver.apply(
                    conn, store.sql, request, now, begin=begin, end=("COMMIT",)
                )
                store.foreign.made(version)  # made known only by COMMIT's answer
            except BaseException as err:
                if not conn.broken:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                if isinstance(err, psycopg.Error):
                    raise translate(err, "commit", store.shown) from err
                raise
            if store._count_commit():
                with contextlib.suppress(psycopg.Error):
                    resolver.prune(conn, store.sql, now)
            return version, 0
        finally:
            store._release(conn)

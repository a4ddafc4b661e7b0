"""Commit notifications: every commit to a schema's quick tables sends a NOTIFY on the
schema's channel (in the commit's own statement, ``Statements.commit``), which PostgreSQL
delivers when that transaction commits, an application's included. One listening
connection per store object lets its commit watcher (``quickzones.store.changes``) wake at
once instead of at its next read of the commit counter. A hint only: the watcher still reads
the counter (whose commit it was), and still polls it at its tick, so commits made by a quick
that sends no NOTIFY are heard as before."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from quickzones.backends.postgres.resolver import Connection
from quickzones.backends.postgres.sql import channel

SLICE_S = 0.1  # the longest close() waits for a waiting thread


class CommitNotifications:
    """Waits on one connection that LISTENs to a schema's channel."""

    def __init__(self, connect: Callable[[], Connection], schema: str, own: str) -> None:
        self._connect = connect
        # The payload of this store object's own commits: they wake nobody here (its
        # process's consumers hear of them directly, and data_version leaves them out).
        self._own = own
        self._listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema)))
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._pid = os.getpid()
        self._closed = False

    def wait(self, timeout_s: float) -> None:
        """Return when a commit to the schema was notified since the last call, or after
        ``timeout_s``. Without a listening connection (it failed; it is made again at the
        next call), sleeps ``timeout_s``."""
        with self._lock:
            fresh = self._conn is None or self._conn.closed
            conn = self._listening()
            if conn is None:
                time.sleep(timeout_s)
                return
            if fresh:
                return  # a commit before LISTEN took effect was not notified: read now
            deadline = time.monotonic() + timeout_s
            try:
                # Every notification already here and the first to come: one wake-up.
                # In slices, so that close() never waits long for this lock.
                while not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._notified(conn, min(left, SLICE_S)):
                        break
            except psycopg.Error:
                self._drop()

    def _notified(self, conn: Connection, timeout_s: float) -> bool:
        notified = False
        for n in conn.notifies(timeout=timeout_s, stop_after=1):
            notified = notified or n.payload != self._own
        for n in conn.notifies(timeout=0.0):
            notified = notified or n.payload != self._own
        return notified

    def _listening(self) -> Connection | None:
        if os.getpid() != self._pid:
            self._conn, self._pid = None, os.getpid()  # the parent's session: not ours
        if self._closed:
            return None
        if self._conn is None or self._conn.closed:
            try:
                conn = self._connect()
                conn.execute(self._listen)
            except psycopg.Error:
                return None
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def close(self) -> None:
        self._closed = True
        if os.getpid() == self._pid:
            with self._lock:
                self._drop()

"""Commit notifications: a commit that makes a zone's pointer vest earlier sends a NOTIFY
on the schema's channel in its own statement (``Statements.commit_waking``), which
PostgreSQL delivers when that transaction commits, an application's included. One listening
connection per store object lets its commit watcher (``quickzones.store.changes``) wake at
once instead of at its next read of the commit counter. A hint only: the watcher still reads
the counter (whose commit it was), and still polls it at its tick, so commits made by a quick
that sends no NOTIFY are heard as before.

A thread reads the connection's notifications as they come, whether anyone waits or not:
a listening session whose client stops reading keeps the server's notification queue from
being trimmed (it grows until every NOTIFY fails). It stops, closing the connection, after
``idle_s`` without a wait; the next wait starts it again.

When the listening connection fails (terminated by ``pg_terminate_backend``, the server
restarting or down) the next wait after a backoff makes a new one: ``connects`` counts
them. Connecting is a storage error, not a psycopg one (``PostgresStore._connect``
translates it): before, that escaped the reading thread, Python printed its traceback,
and the next wait started another thread at once, a traceback per wait while the server
was down (issue 40 point 8). A streak of failures is logged once per interval with a
count, and once on recovery."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from quickzones.backends.postgres.resolver import Connection
from quickzones.backends.postgres.sql import channel
from quickzones.errors import StorageError
from quickzones.repeated_failure import RepeatedFailure, backoff

log = logging.getLogger("quick.postgres")

IDLE_S = 10.0  # without a wait this long, the listening connection is closed
# How often the reading thread looks whether it should stop: each look costs a wake-up
# of an idle worker (issue 44 point 4), so not often.
SLICE_S = 2.0
RETRY_S = 1.0  # after the listening connection failed, waits only sleep about this long
RETRY_CAP_S = 10.0  # ... growing with each failure in a row up to this


class CommitNotifications:
    """Waits for NOTIFYs on a schema's channel from other store objects."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        schema: str,
        own: str,
        *,
        idle_s: float = IDLE_S,
    ) -> None:
        self._connect = connect
        self._listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema)))
        # The payload of this store object's own commits: they wake nobody here (its
        # process's consumers hear of them directly, and data_version leaves them out).
        self._own = own
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._notified = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_wait = 0.0
        self._retry_at = 0.0  # no listening before then (the last connection failed)
        self._pid = os.getpid()
        self._closed = False
        self.connects = 0  # listening connections made (a reconnect makes one more)
        self.failures = RepeatedFailure(
            log,
            "listening for commit notifications",
            level=logging.WARNING,
            failing=f"listening for commit notifications on {schema!r} failed",
            recovered=f"listening for commit notifications on {schema!r} again",
        )

    def wait(self, timeout_s: float) -> None:
        """Return when a commit to the schema was notified since the last call, or after
        ``timeout_s`` (at once after the listening connection was made: a commit before
        its LISTEN took effect was not notified)."""
        with self._lock:
            if os.getpid() != self._pid:  # a forked child: the parent's thread is not here
                self._thread, self._pid = None, os.getpid()
            self._last_wait = now = time.monotonic()
            if self._thread is None and not self._closed and now >= self._retry_at:
                self._notified.clear()
                self._thread = threading.Thread(
                    target=self._read, name="quick-commit-notifications", daemon=True
                )
                self._thread.start()
        self._notified.wait(timeout_s)
        self._notified.clear()

    def _read(self) -> None:
        conn: Connection | None = None
        try:
            conn = self._connect()
            conn.execute(self._listen)
            self.connects += 1
            self.failures.succeeded()
            self._notified.set()  # listening now: whoever waits reads the counter again
            while not self._stopping():
                for n in conn.notifies(timeout=SLICE_S):
                    if n.payload != self._own:
                        self._notified.set()
        except (psycopg.Error, StorageError) as err:
            # The waiter polls at its tick meanwhile (a server restarting, no connection
            # to spare): no new connection for a while, longer after each failure.
            failures = self.failures.failed(err)
            wait_s = RETRY_S + backoff(failures, base_s=RETRY_S / 2, cap_s=RETRY_CAP_S)
            with self._lock:
                self._retry_at = time.monotonic() + wait_s
            self._notified.set()
        finally:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _stopping(self) -> bool:
        with self._lock:
            return self._closed or time.monotonic() - self._last_wait > self._idle_s

    def close(self) -> None:
        """The reading thread ends within ``SLICE_S``, closing its connection."""
        with self._lock:
            self._closed = True

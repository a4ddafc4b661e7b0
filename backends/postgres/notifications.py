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
count, and once on recovery.

Behind PgBouncer in transaction pooling mode LISTEN cannot work: the listening session is
lent to other clients between statements, and PgBouncer drops a notification that reaches
it while it is idle ("got packet 'A' from server when not linked"). So a listening
connection first proves it hears: it sends a NOTIFY of its own (a probe, from another
connection) and waits for it, or any notification, up to ``PROBE_S``. One that hears
nothing gives up for good: UNLISTEN, close, and from then on waits only sleep, so the
commit watcher polls at its tick; said once in the log (WARNING), as the URL option
``listen=off`` (never LISTEN) is said once at the first wait (INFO). Until a listening
connection has proved it hears, :attr:`CommitNotifications.signalled` is False: the
watcher polls meanwhile instead of sleeping on a signal that may never come (issue 42
point 2)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
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
# How long a new listening connection waits for its probe (or any notification) before
# it concludes that notifications do not reach it (PgBouncer's transaction pooling).
# Delivered on a direct connection within milliseconds; generous for a loaded machine.
PROBE_S = 5.0


class CommitNotifications:
    """Waits for NOTIFYs on a schema's channel from other store objects."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        schema: str,
        own: str,
        *,
        idle_s: float = IDLE_S,
        listen: bool = True,
        probe_s: float = PROBE_S,
    ) -> None:
        self._connect = connect
        self._schema = schema
        self._channel = channel(schema)
        self._listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
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
        self._probe_s = probe_s
        # Waits only sleep (the watcher polls): LISTEN is off (``listen=off``) or a
        # listening connection heard nothing of its probe. Said once in the log.
        self._polling = not listen
        self._said_polling = False
        # A listening connection is up and has heard a notification: waits return on
        # commits. False while unknown (connecting, probing, after a failure).
        self._hearing = False
        self.connects = 0  # listening connections made (a reconnect makes one more)
        self.failures = RepeatedFailure(
            log,
            "listening for commit notifications",
            level=logging.WARNING,
            failing=f"listening for commit notifications on {schema!r} failed",
            recovered=f"listening for commit notifications on {schema!r} again",
        )

    @property
    def signalled(self) -> bool:
        """Whether a wait returns on a commit now (a listening connection that has heard a
        notification is up), not only at its timeout: then a watcher may sleep on it."""
        return self._hearing and not self._polling and os.getpid() == self._pid

    def wait(self, timeout_s: float) -> None:
        """Return when a commit to the schema was notified since the last call, or after
        ``timeout_s`` (at once after the listening connection was made: a commit before
        its LISTEN took effect was not notified; always after ``timeout_s`` when polling)."""
        with self._lock:
            if os.getpid() != self._pid:  # a forked child: the parent's thread is not here
                self._thread, self._pid, self._hearing = None, os.getpid(), False
            self._last_wait = now = time.monotonic()
            polling = self._polling
            if polling:
                say, self._said_polling = not self._said_polling, True
                if say:
                    log.info(
                        "commit notifications on %r are off (listen=off): an idle consumer"
                        " finds other processes' commits by polling",
                        self._schema,
                    )
            elif self._thread is None and not self._closed and now >= self._retry_at:
                self._notified.clear()
                self._thread = threading.Thread(
                    target=self._read, name="quick-commit-notifications", daemon=True
                )
                self._thread.start()
        if polling:
            time.sleep(timeout_s)
            return
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
            if not self._hears(conn):
                self._give_up(conn)
                return
            self._hearing = True
            while not self._stopping():
                for n in _arrived(conn, SLICE_S):
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
            self._hearing = False
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _hears(self, conn: Connection) -> bool:
        """Whether notifications reach ``conn``, which LISTENs: a probe NOTIFY sent from
        another connection (or any other notification) arrives within ``probe_s``. Other
        store objects' listeners hear the probe too: one spurious read of their counter."""
        probe = self._connect()
        try:
            probe.execute("SELECT pg_notify(%s, %s)", (self._channel, f"probe {self._own}"))
        finally:
            with contextlib.suppress(psycopg.Error):
                probe.close()
        for n in conn.notifies(timeout=self._probe_s, stop_after=1):
            if n.payload != self._own:
                self._notified.set()
            return True
        return False

    def _give_up(self, conn: Connection) -> None:
        """Notifications do not reach the listening connection: stop listening for good
        (UNLISTEN, so the server session PgBouncer lent stops receiving them, if this
        statement runs on it) and wake on commits by polling, said once."""
        with contextlib.suppress(psycopg.Error):
            conn.execute("UNLISTEN *")
        with self._lock:
            self._polling = self._said_polling = True
        log.warning(
            "commit notifications on %r do not reach this process's listening connection"
            " (a pooler between it and the server, such as PgBouncer in transaction pooling"
            " mode): an idle consumer finds other processes' commits by polling from now"
            " on; add listen=off to the store URL to skip this check",
            self._schema,
        )
        self._notified.set()

    def _stopping(self) -> bool:
        with self._lock:
            return self._closed or time.monotonic() - self._last_wait > self._idle_s

    def close(self) -> None:
        """The reading thread ends within ``SLICE_S``, closing its connection."""
        with self._lock:
            self._closed = True


def _arrived(conn: Connection, timeout_s: float) -> list[psycopg.Notify]:
    """The notifications that arrive on ``conn`` within ``timeout_s`` (none, or those of
    the first packet that brings some). The thread sleeps on the connection's socket:
    psycopg's own ``notifies(timeout=...)`` wakes every 100 ms to look for Ctrl-C, ten
    wake-ups a second of an idle process's listener, the most of any thread of an idle
    worker (issue 44 point 4). A socket that turns readable at the server's end (EOF)
    makes ``notifies`` raise, as a broken connection does."""
    readable, _, _ = select.select([conn.fileno()], [], [], timeout_s)
    if not readable:
        return []
    return list(conn.notifies(timeout=0))

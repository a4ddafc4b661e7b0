"""Background WAL checkpoints for one SQLiteStore in one process.

SQLite's automatic checkpoint runs inside the COMMIT that pushes the WAL past 1,000 pages:
that commit copies the WAL into the database file and fsyncs it while it still holds the
write lock, so every writer queued behind it (a manager leasing a zone, a completion, a
timer that just vested) waits for a disk flush, several ms on a shared disk. That was the
tail of delayed items' lateness. Our connections turn the automatic checkpoint off and
this thread runs a PASSIVE checkpoint instead, after every ``every_commits`` commits (or
``idle_s`` after the last one): PASSIVE takes no write lock, so commits go on meanwhile,
and the next writer after a complete pass restarts the WAL from its beginning. Under
continuous writes a passive pass never quite catches up (new frames arrive while it
copies), so after each pass ``after_pass`` (``SQLiteStore._bound_wal``) truncates the WAL
once it passed its bound: with the passes having copied nearly everything already, that
blocking step is short and rare (once per 16 MB of WAL instead of a full copy every 4 MB),
and it runs on this thread, not in some caller's commit.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable

# About the automatic checkpoint's 1,000 pages at our commits' few pages each.
EVERY_COMMITS = 128
IDLE_S = 1.0


class Checkpointer:
    """Runs passive checkpoints on a daemon thread, started at the first commit."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        after_pass: Callable[[sqlite3.Connection], None] = lambda conn: None,
        every_commits: int = EVERY_COMMITS,
        idle_s: float = IDLE_S,
    ) -> None:
        self._connect = connect
        self._after_pass = after_pass
        self.every_commits = every_commits
        self.idle_s = idle_s
        self._cond = threading.Condition()
        self._since = 0  # commits since the last checkpoint began
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self.passes = 0  # checkpoints run (for tests and benches)
        self.failures = 0

    def committed(self) -> None:
        """Count a commit; wake the thread once enough have gone by."""
        if self._pid != os.getpid():
            # A forked child: the parent's thread is not here, and its lock may have been
            # held at the fork. Start afresh.
            self._cond = threading.Condition()
            self._thread = None
            self._since = 0
            self._pid = os.getpid()
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                self._start()
            self._since += 1
            if self._since >= self.every_commits:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="quick-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._cond:
                    while not self._closed and self._since < self.every_commits:
                        if not self._cond.wait(self.idle_s) and self._since:
                            break  # quiet for idle_s with commits not yet checkpointed
                    if self._closed:
                        return
                    self._since = 0
                try:
                    if conn is None:
                        conn = self._connect()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.passes += 1
                    self._after_pass(conn)
                except sqlite3.Error:
                    # Best effort: another process's checkpoint, a full disk. The next
                    # pass (or _bound_wal's truncating one) catches up.
                    self.failures += 1
                    if conn is not None:
                        with contextlib.suppress(sqlite3.Error):
                            conn.close()
                    conn = None
        finally:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

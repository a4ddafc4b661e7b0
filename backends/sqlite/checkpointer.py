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
copies), so after each pass ``after_pass`` (``SQLiteStore._bound_wal``, given the pass's
result) restarts the WAL once it holds its bound: with the passes having copied nearly
everything already, that blocking step is short and rare (once per 16 MB of WAL instead
of a full copy every 4 MB), and it runs on this thread, not in some caller's commit.

A ``fork()`` waits for a pass in progress to end (``os.register_at_fork``): a child
forked while this thread was inside SQLite could inherit SQLite's process-wide mutexes
locked, by a thread that does not exist in the child, and hang at its first statement.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import NamedTuple

from quickzones.backends.sqlite.state import process_id
from quickzones.errors import StorageError, StoreLost


class PassResult(NamedTuple):
    """What ``PRAGMA wal_checkpoint`` returned: whether it was blocked, the frames in the
    WAL and how many of them are copied into the database."""

    busy: int
    log: int
    copied: int


# About the automatic checkpoint's 1,000 pages at our commits' few pages each.
EVERY_COMMITS = 128
IDLE_S = 1.0


class Checkpointer:
    """Runs passive checkpoints on a daemon thread, started at the first commit."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        after_pass: Callable[[sqlite3.Connection, PassResult], None] = lambda conn, r: None,
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
        # Held for each pass's SQLite calls, and by a fork() in progress (see the module).
        self._pass_lock = threading.Lock()
        self.passes = 0  # checkpoints run (for tests and benches)
        self.failures = 0
        _LIVE.add(self)

    def committed(self) -> None:
        """Count a commit; wake the thread once enough have gone by."""
        if self._pid != process_id():
            # A forked child: the parent's thread is not here, and its lock may have been
            # held at the fork. Start afresh.
            self._forked()
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                self._start()
            self._since += 1
            if self._since >= self.every_commits:
                self._cond.notify()

    def _forked(self) -> None:
        """In a forked child: the parent's thread is not here, and its locks may have been
        held at the fork. Start afresh."""
        self._cond = threading.Condition()
        self._pass_lock = threading.Lock()
        self._thread = None
        self._since = 0
        self._pid = os.getpid()

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
                    with self._pass_lock:
                        if conn is None:
                            conn = self._connect()
                        busy, log, copied = conn.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)"
                        ).fetchone()
                        self.passes += 1
                        self._after_pass(conn, PassResult(busy, log, copied))
                except StoreLost:
                    return  # the file was deleted or replaced: nothing left to fold in
                except (sqlite3.Error, StorageError):
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


_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()
_HELD: list[Checkpointer] = []


# A pass stuck longer than this (a stalled disk) does not hold a fork up for good.
_FORK_WAIT_S = 10.0


def _before_fork() -> None:
    for checkpointer in list(_LIVE):
        # A pass in progress ends first. (A child whose fork did not wait still starts
        # afresh at its first commit: Checkpointer.committed.)
        if checkpointer._pass_lock.acquire(timeout=_FORK_WAIT_S):
            _HELD.append(checkpointer)


def _after_fork_in_parent() -> None:
    while _HELD:
        _HELD.pop()._pass_lock.release()


def _after_fork_in_child() -> None:
    while _HELD:
        _HELD.pop()._forked()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)

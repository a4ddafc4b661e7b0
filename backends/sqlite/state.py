"""The state a SQLite store shares with the mixins its connection pool, its commit
resolver and its WAL bound are written in, and the two helpers they all use: a random
draw and taking the write lock."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time

from quickzones.backends._foreign_commits import ForeignCommits
from quickzones.backends.sqlite.errors import _is_busy, _translate
from quickzones.backends.sqlite.file_identity import FileIdentity
from quickzones.backends.sqlite.known_values import KnownValues
from quickzones.clock import Clock
from quickzones.errors import StoreBusy

# SQLite's busy handler on every connection (``sqlite3.connect``'s timeout): it covers
# statements other than taking the write lock, which _begin_immediate polls finely.
_BUSY_SLICE_S = 0.005
_BUSY_SLICE_MS = int(_BUSY_SLICE_S * 1000)
# _begin_immediate's pauses between looks at a write lock another connection holds.
_FIRST_PAUSE_S = 0.00005
_LONGEST_PAUSE_S = 0.001

# This process's id, kept by a fork hook: os.getpid() is a system call (glibc no longer
# caches it) that each commit made three times, to notice a fork.
_pid = os.getpid()


def process_id() -> int:
    """``os.getpid()``, without the system call."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class SQLiteStoreState:
    """Attributes set by ``SQLiteStore.__init__``, read by its mixins."""

    path: str
    url: str
    clock: Clock
    _synchronous: str
    busy_timeout_ms: int
    _busy_timeout_s: float
    _rng: random.Random
    _lock: threading.Lock
    _write_lock: threading.Lock
    _pool: list[sqlite3.Connection]
    _inherited: list[sqlite3.Connection]
    _pid: int
    _commits: int
    _checkpoint_lock: threading.Lock
    _checkpoint_at: int
    checkpoints: int
    _page_bytes: int | None
    _closed: bool
    _foreign: ForeignCommits
    _known: KnownValues
    _file: FileIdentity

    def _random(self) -> float:
        with self._lock:
            return self._rng.random()

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting up to ``busy_timeout_ms`` in fine polls.

        SQLite's own busy handler (the connection's ``_BUSY_SLICE_S``) sleeps 1 ms, then
        2 ms, before it looks again: a commit that met another process's (a worker's visit
        while the application enqueues, or the reverse) waited at least 1 ms and often
        5-12 ms for a lock held a few hundred microseconds at a time, and small tenants'
        pickups under a noisy producer took those waits at their tail (p99 26-45 ms
        against 17-19 ms polled finely, ``bench.peers_users``, three pairs). So the handler
        is off for this statement: the first look is at once, the next after
        ``_FIRST_PAUSE_S``, doubling up to ``_LONGEST_PAUSE_S``."""
        deadline = time.monotonic() + self._busy_timeout_s
        pause = _FIRST_PAUSE_S
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as err:
                    if not _is_busy(err):
                        raise _translate(err, "BEGIN IMMEDIATE", self.url) from err
                    if time.monotonic() >= deadline:
                        # Another connection held the lock all along: retrying at once
                        # would only wait again, so the caller hears of it (not run()'s
                        # loop).
                        raise StoreBusy(self.url, self.busy_timeout_ms) from err
                except sqlite3.Error as err:
                    raise _translate(err, "BEGIN IMMEDIATE", self.url) from err
                time.sleep(pause)
                pause = min(pause * 2, _LONGEST_PAUSE_S)
        finally:
            # Every other statement keeps the short handler (a reader meeting a WAL
            # restart's brief lock waits it out instead of failing).
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_SLICE_MS}")

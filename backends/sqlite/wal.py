"""Keeping the WAL bounded: after a background checkpoint pass, restart the WAL once it
holds ``WAL_CHECKPOINT_BYTES`` of frames."""

from __future__ import annotations

import sqlite3

from quickzones.backends.sqlite.checkpointer import PassResult
from quickzones.backends.sqlite.state import _BUSY_SLICE_MS, SQLiteStoreState

# The WAL is checkpointed and restarted once it holds this many bytes (see _bound_wal).
WAL_CHECKPOINT_BYTES = 16 * 1024 * 1024
# Each WAL frame is a page and this header.
_WAL_FRAME_HEADER = 24
# How long a truncating checkpoint waits for older snapshots to end (writers wait too).
# It usually succeeds within a few hundred ms; when readers starve it (SQLite's busy
# handler polls every 100 ms), a retry soon after does better than a longer wait.
_CHECKPOINT_WAIT_MS = 1000
# After a checkpoint that found readers in the way: retry once the WAL grew this much.
_CHECKPOINT_RETRY_BYTES = 2 * 1024 * 1024


class WalBound(SQLiteStoreState):
    """The checkpointer's ``after_pass`` of a store."""

    def _bound_wal(self, conn: sqlite3.Connection, passed: PassResult) -> None:
        """After a background pass (``passed``): checkpoint and restart the WAL once it
        holds ``WAL_CHECKPOINT_BYTES`` of frames.

        SQLite's automatic checkpoint is passive: it copies pages back into the database
        but restarts the WAL only at a moment when no reader holds a snapshot in it. With
        overlapping read transactions that moment never comes and the WAL grows without
        bound. A RESTART checkpoint takes the write lock, waits (up to
        ``_CHECKPOINT_WAIT_MS``) for the snapshots older than the newest commit to end
        (new readers read the database file meanwhile), copies the few frames the pass
        left, and the next commit writes from the WAL's start, reusing the file. Our
        snapshots are short (the 5 s lifetime bounds them), so the wait is too; if it
        fails anyway, the next pass after the WAL grew by ``_CHECKPOINT_RETRY_BYTES``
        tries again. Not TRUNCATE: shrinking the file to nothing held the write lock
        through its truncation and a disk flush, 10-17 ms against ~2 ms here, and every
        writer in every process waited (``journal_size_limit`` trims a file that grew
        past twice the bound, at the first commit after a restart).
        """
        wal_bytes = passed.log * (self._page_size(conn) + _WAL_FRAME_HEADER)
        if wal_bytes < self._checkpoint_at or not self._checkpoint_lock.acquire(blocking=False):
            return
        # This process's committers wait for the restart (it blocks writers while it
        # runs anyway): one that took SQLite's write lock again between the busy
        # handler's polls kept the restart waiting its whole second, pass after pass,
        # and the WAL of a loop of commits on a loaded host grew past twice its bound.
        held = self._write_lock.acquire(timeout=_CHECKPOINT_WAIT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_CHECKPOINT_WAIT_MS}")
            try:
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_SLICE_MS}")
                if held:
                    self._write_lock.release()
                    held = False
            if busy:
                self._checkpoint_at = wal_bytes + _CHECKPOINT_RETRY_BYTES
            else:
                self._checkpoint_at = WAL_CHECKPOINT_BYTES
                self.checkpoints += 1
        except sqlite3.Error:
            # Best effort (e.g. a full disk): the commit already succeeded; try again later.
            self._checkpoint_at = wal_bytes + _CHECKPOINT_RETRY_BYTES
        finally:
            if held:
                self._write_lock.release()
            self._checkpoint_lock.release()

    def _page_size(self, conn: sqlite3.Connection) -> int:
        if self._page_bytes is None:
            self._page_bytes = int(conn.execute("PRAGMA page_size").fetchone()[0])
        return self._page_bytes

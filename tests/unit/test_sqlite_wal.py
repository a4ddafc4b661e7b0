"""The SQLite WAL stays bounded under continuous load with overlapping readers (issue 12
point 9); ``bench/wal_growth.py`` measures the same loads over time."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

from quickzones.backends.sqlite import SQLiteStore
from quickzones.kv import KVTransaction, run

BOUND = 64 * 1024 * 1024


def test_wal_stays_bounded_while_read_transactions_always_overlap(tmp_path: Path) -> None:
    path = str(tmp_path / "wal.db")
    store = SQLiteStore(path)
    stop = threading.Event()
    peak = [0]
    reads = [0]
    value = os.urandom(2000)

    def reader(offset: float) -> None:
        time.sleep(offset)
        while not stop.is_set():

            def read(tr: KVTransaction) -> None:
                tr.get_range(b"k", b"l", limit=20)
                time.sleep(0.04)  # holds its snapshot, as a slow handler does

            run(store, read)
            reads[0] += 1

    # Four readers, staggered, so some snapshot is open at every moment.
    readers = [threading.Thread(target=reader, args=(i * 0.01,)) for i in range(4)]
    for thread in readers:
        thread.start()
    try:
        # About 40 KB of WAL frames per commit: 200 MB in all if the WAL never restarts.
        for n in range(5000):

            def write(tr: KVTransaction, n: int = n) -> None:
                for j in range(16):
                    tr.set(b"k%03d-%02d" % (n % 300, j), value)

            run(store, write)
            if n % 25 == 0:
                peak[0] = max(peak[0], os.path.getsize(path + "-wal"))
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=30)
    assert reads[0] > 0
    assert peak[0] < BOUND, f"WAL reached {peak[0] / 1e6:.0f} MB"
    assert store.checkpoints > 0
    assert len(store.snapshot_items()) == 300 * 16
    store.close()


def test_checkpoints_run_beside_commits_and_keep_the_wal_bounded(tmp_path: Path) -> None:
    """No commit copies the WAL back (a checkpoint inside a commit holds the write lock
    through a disk flush, and every writer queued behind it waits): a background thread
    checkpoints, and the WAL stays bounded under writes that never pause."""
    path = str(tmp_path / "bg.db")
    store = SQLiteStore(path)
    value = os.urandom(8000)
    peak = 0
    try:
        # About 8 KB per commit, 24 MB in all if the WAL never restarted.
        for n in range(3000):
            run(store, lambda tr, n=n: tr.set(b"k%04d" % (n % 500), value))
            if n % 50 == 0:
                peak = max(peak, os.path.getsize(path + "-wal"))
        deadline = time.monotonic() + 30
        while store.checkpointer.passes == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.checkpointer.passes > 0
        assert peak < 24 * 1024 * 1024, f"WAL reached {peak / 1e6:.1f} MB"
        assert len(store.snapshot_items()) == 500
    finally:
        store.close()
    reopened = SQLiteStore(path)
    try:
        assert len(reopened.snapshot_items()) == 500
    finally:
        reopened.close()


def _commit_in_child(path: str, out: multiprocessing.Queue[int]) -> None:
    store = _INHERITED[0]
    for n in range(400):
        run(store, lambda tr, n=n: tr.set(b"c%03d" % (n % 50), b"x" * 4000))
    deadline = time.monotonic() + 20
    while store.checkpointer.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    out.put(store.checkpointer.passes)


_INHERITED: list[SQLiteStore] = []


def test_a_forked_child_checkpoints_on_its_own_thread(tmp_path: Path) -> None:
    """A store used before a fork keeps working in the child, whose commits are
    checkpointed by a thread of its own (the parent's does not exist there)."""
    path = str(tmp_path / "fork.db")
    store = SQLiteStore(path)
    for n in range(200):
        run(store, lambda tr, n=n: tr.set(b"p%03d" % n, b"y" * 4000))
    _INHERITED[:] = [store]
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[int] = ctx.Queue()
    child = ctx.Process(target=_commit_in_child, args=(path, out))
    child.start()
    try:
        assert out.get(timeout=60) > 0
    finally:
        child.join(timeout=30)
        _INHERITED.clear()
    assert child.exitcode == 0
    assert len(store.snapshot_items()) == 250
    store.close()

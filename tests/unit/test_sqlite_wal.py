"""The SQLite WAL stays bounded under continuous load with overlapping readers (issue 12
point 9); ``bench/wal_growth.py`` measures the same loads over time."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from quickzones.backends.sqlite import SQLiteStore
from quickzones.backends.sqlite.checkpointer import Checkpointer
from quickzones.store.kv import KVTransaction, run

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


def test_the_wal_is_bounded_by_reusing_it_not_by_truncating_it(tmp_path: Path) -> None:
    """Shrinking the WAL to nothing holds the write lock through the file's truncation
    and a disk flush (10-17 ms here) while every writer in every process waits. The
    bounding checkpoint restarts the WAL instead: the next commits overwrite the file
    from its start, so it stays bounded without ever being emptied."""
    path = str(tmp_path / "reuse.db")
    store = SQLiteStore(path)
    value = os.urandom(8000)
    sizes: list[int] = []
    try:
        # About 8 KB per commit: 48 MB in all, three times the bound.
        for n in range(6000):
            run(store, lambda tr, n=n: tr.set(b"k%04d" % (n % 500), value))
            if n % 20 == 0:
                run(store, lambda tr: tr.get(b"k0000"))  # a short read now and then
                sizes.append(os.path.getsize(path + "-wal"))
        assert store.checkpoints > 0  # the bound was reached and enforced
        grown = sizes.index(next(s for s in sizes if s > 4 * 1024 * 1024))
        assert min(sizes[grown:]) > 1024 * 1024, "the WAL was emptied (truncated)"
        assert max(sizes) < 40 * 1024 * 1024, f"WAL reached {max(sizes) / 1e6:.1f} MB"
        assert len(store.snapshot_items()) == 500
    finally:
        store.close()


def _commit_in_child(store: SQLiteStore, out: multiprocessing.Queue[int]) -> None:
    for n in range(400):
        run(store, lambda tr, n=n: tr.set(b"c%03d" % (n % 50), b"x" * 4000))
    deadline = time.monotonic() + 20
    while store.checkpointer.passes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    out.put(store.checkpointer.passes)


def fork_scenario(path: str) -> None:
    """Run in a process of its own (below): a store used before a fork, then a child that
    keeps using it. Exits 0 when it all held."""
    store = SQLiteStore(path)
    for n in range(200):
        run(store, lambda tr, n=n: tr.set(b"p%03d" % n, b"y" * 4000))
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[int] = ctx.Queue()
    child = ctx.Process(target=_commit_in_child, args=(store, out))
    child.start()
    try:
        assert out.get(timeout=60) > 0, "the child's checkpointer never ran"
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0
    assert len(store.snapshot_items()) == 250
    store.close()


def test_a_forked_child_checkpoints_on_its_own_thread(tmp_path: Path) -> None:
    """A store used before a fork keeps working in the child, whose commits are
    checkpointed by a thread of its own (the parent's does not exist there). In a fresh
    process: this one's other threads (other tests' consumers, the fdb client) could hold
    SQLite's process-wide mutexes at the fork, which no library can make safe."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests.unit.test_sqlite_wal import fork_scenario; "
            "fork_scenario(sys.argv[1])",
            str(tmp_path / "fork.db"),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_fork_waits_for_a_checkpoint_pass_in_progress(tmp_path: Path) -> None:
    """A child forked while the checkpointer thread is inside SQLite could inherit SQLite's
    mutexes locked by a thread it does not have, and hang: the fork waits for the pass."""
    in_pass = threading.Event()
    finished: list[int] = []

    def slow_after_pass(conn: sqlite3.Connection, passed: object) -> None:
        in_pass.set()
        time.sleep(0.3)
        finished.append(os.getpid())

    checkpointer = Checkpointer(
        lambda: sqlite3.connect(str(tmp_path / "c.db")), after_pass=slow_after_pass, every_commits=1
    )
    checkpointer.committed()
    assert in_pass.wait(20)
    pid = os.fork()
    if pid == 0:  # the child: its own checkpointer thread runs a pass of its own
        before = checkpointer.passes
        checkpointer.committed()
        deadline = time.monotonic() + 20
        while checkpointer.passes == before and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if checkpointer.passes > before else 1)
    try:
        assert finished == [os.getpid()], "fork() returned while the pass was still running"
    finally:
        _, status = os.waitpid(pid, 0)
        checkpointer.close()
    assert os.waitstatus_to_exitcode(status) == 0

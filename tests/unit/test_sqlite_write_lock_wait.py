"""A commit that meets another connection's write lock looks again within microseconds,
not after SQLite's busy handler's 1-2 ms sleeps (issue 44 point 3: small tenants' pickups
under a noisy producer waited 5-12 ms at a time for a lock held a few hundred
microseconds; ``bench.peers_users`` measures the effect, this the mechanism)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from quickzones.client import Quick


def test_a_commit_waiting_for_the_write_lock_polls_it_itself_with_the_handler_off(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    q = Quick.open(f"sqlite:///{path}")
    try:
        q.enqueue("j", {}, app="a", tenant="t")  # the zone exists: the next one writes
        store = q.kv
        traced: list[str] = []
        lock = threading.Lock()

        def trace(statement: str) -> None:
            with lock:
                traced.append(statement.strip())

        for conn in store._pool:
            conn.set_trace_callback(trace)
        other = sqlite3.connect(path, isolation_level=None)  # another process's writer
        other.execute("BEGIN IMMEDIATE")
        done = threading.Event()
        t = threading.Thread(target=lambda: (q.enqueue("j", {}, app="a", tenant="u"), done.set()))
        t.start()
        try:
            # It looks at the lock again and again while the other holds it.
            deadline = time.monotonic() + 10
            while traced.count("BEGIN IMMEDIATE") < 3:
                assert time.monotonic() < deadline, traced
                time.sleep(0.001)
        finally:
            other.execute("COMMIT")
            other.close()
        assert done.wait(10)
        t.join(5)
        first = traced.index("BEGIN IMMEDIATE")
        # Each look with SQLite's handler off (it would sleep 1 ms, then 2 ms, before
        # looking again), and the handler back for the statements after it.
        assert traced[first - 1] == "PRAGMA busy_timeout = 0", traced
        assert "PRAGMA busy_timeout = 5" in traced[first:], traced
    finally:
        q.close()

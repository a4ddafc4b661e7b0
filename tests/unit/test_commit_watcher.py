"""The commit watcher (``quickzones.store.changes``): where reading the store's commit
counter is a round trip (PostgreSQL: ``data_version_tick_s``), a consumer woken by a
commit must not pay another one before its scan (issue 30 (b): each is time on a small
tenant's pickup), and a value so reused must never hide a commit."""

from __future__ import annotations

import threading
import time

from quickzones.store.changes import CommitWatcher
from tests.waiting import wait_for


class Counter:
    def __init__(self) -> None:
        self.value = 0
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.value


def test_a_scan_right_after_a_wake_reads_no_counter_again() -> None:
    counter = Counter()
    watcher = CommitWatcher(counter, floor_s=0.5)
    woke = threading.Event()
    since = watcher.version()
    with watcher.watching(woke.set, since, tick_s=0.5):
        counter.value += 1  # another process commits
        assert woke.wait(5)
    reads = counter.reads
    # The scan the wake-up starts: the counter the watcher just read, not a round trip.
    assert watcher.version() == 1
    assert counter.reads == reads


def test_a_reused_counter_never_hides_a_commit() -> None:
    """The value reused is at most the store's tick old: a commit made after it was read
    calls the next watcher back at once (a scan to spare, never one missed)."""
    counter = Counter()
    watcher = CommitWatcher(counter, floor_s=0.5)
    seen = watcher.version()
    counter.value += 1  # committed after the read, before the scan's snapshot
    reused = watcher.version()
    assert reused == seen  # within the tick: not read again
    woke = threading.Event()
    with watcher.watching(woke.set, reused, tick_s=0.5):
        assert woke.wait(5)


def test_where_the_counter_is_cheap_every_version_is_read() -> None:
    """SQLite's counter is a read of shared memory (no floor): nothing is reused."""
    counter = Counter()
    watcher = CommitWatcher(counter)
    watcher.version()
    watcher.version()
    assert counter.reads == 2


def test_the_reused_value_expires_after_the_tick() -> None:
    counter = Counter()
    watcher = CommitWatcher(counter, floor_s=0.02)
    watcher.version()
    counter.value += 1
    time.sleep(0.05)
    assert watcher.version() == 1


def test_a_signalled_commit_calls_back_before_the_counter_is_read() -> None:
    """A PostgreSQL NOTIFY from another store object says that a commit made a zone's
    pointer vest earlier: the watchers are called back at once, and the counter read
    (a round trip) comes after, not on the pickup's path (issue 42: pickup at light
    load). Here that read is held until the wake-up was seen: before, the wake-up waited
    for it. The read then finds the commit the wake-up announced, and calls back no
    second time for it."""
    counter = Counter()
    signal = threading.Event()
    gate = threading.Event()
    gate.set()

    def held() -> int:
        gate.wait(60)  # the round trip, held by the test
        return counter()

    def wait_for_commits(timeout_s: float) -> bool:
        heard = signal.wait(timeout_s)
        signal.clear()
        return heard

    watcher = CommitWatcher(held, floor_s=0.005, waiter=wait_for_commits)
    calls: list[int] = []
    woke = threading.Event()

    def callback() -> None:
        calls.append(1)
        woke.set()

    since = watcher.version()
    with watcher.watching(callback, since, tick_s=60):
        assert wait_for(lambda: counter.reads >= 3)  # the watcher's thread waits now
        gate.clear()
        counter.value += 1  # another process commits, and notifies
        signal.set()
        assert woke.wait(30), "the wake-up waited for the counter's read"
        reads = counter.reads
        gate.set()
        assert wait_for(lambda: counter.reads > reads)  # the read after the wake-up
        assert wait_for(lambda: watcher.version() == 1)
    assert calls == [1]

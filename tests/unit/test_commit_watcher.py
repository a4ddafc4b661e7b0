"""The commit watcher (``quickzones.store.changes``): where reading the store's commit
counter is a round trip (PostgreSQL: ``data_version_tick_s``), a consumer woken by a
commit must not pay another one before its scan (issue 30 (b): each is time on a small
tenant's pickup), and a value so reused must never hide a commit."""

from __future__ import annotations

import threading
import time

from quickzones.store.changes import CommitWatcher


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

"""When the scanner reads the stores' commit counters (issue 44 points 2 and 5, CPU an
item): a busy consumer's scans find work and never wait on commits, so the read each scan
made of every counter (on SQLite two statements once this process's own visits have
committed, a sixth of a lone tenant's scan) paid for nothing. The counters are read
before the peeks of a scan only where an idle wait may watch them: while the scans find
nothing, and again before a scan that follows one that skipped them and found nothing.
The idle wait then watches from a reading made before the peek it trusts, so a commit
between that peek and the wait still wakes it (the guarantee the read is there for)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.state import Cluster
from quickzones.store.toplevel import PointerRef
from tests.scanner_alone import scanner_alone
from tests.waiting import wait_for

BUSY_SCANS = 5


class Script:
    """A shard whose peeks show one vested zone ``BUSY_SCANS`` times, then none; and a
    commit watcher; both note what they are asked, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.peeks = 0
        self.lock = threading.Lock()

    def peek(
        self, cluster: Cluster, shard: int, window: int, horizon_ms: int
    ) -> tuple[list[PointerRef], int | None]:
        with self.lock:
            self.peeks += 1
            self.log.append(("peek", self.peeks))
            if self.peeks <= BUSY_SCANS:
                return [PointerRef(shard, "busy-zone", 0, cluster.name)], None
            return [], None

    # The CommitWatcher the scanner is given (version, watching, signalled).
    signalled = False

    def version(self) -> int:
        with self.lock:
            self.log.append(("version", self.peeks))
        return 41

    @contextmanager
    def watching(
        self, callback: Any, since: int | None = None, *, tick_s: float | None = None
    ) -> Iterator[None]:
        with self.lock:
            self.log.append(("watching", since))
        yield


def test_busy_scans_skip_the_commit_counters_and_the_idle_wait_watches_from_before_its_peek(
    tmp_path: Any,
) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    script = Script()
    scanner = scanner_alone(
        q,
        ConsumerConfig(idle_sleep_s=0.01, commit_poll_s=0.01),
        in_order=True,
        capacity=4,
        watchers=[script],
        peek=script.peek,
    )
    stopping = threading.Event()
    visited: list[int] = []

    def visit(batch: list[PointerRef]) -> int:
        visited.append(len(batch))
        return 1  # took an item: the zone had work

    with ThreadPoolExecutor(2) as managers:
        runner = threading.Thread(target=scanner.run, args=(managers, visit, stopping))
        runner.start()
        try:
            assert wait_for(lambda: ("watching", 41) in script.log)
        finally:
            stopping.set()
            scanner.wake()
            runner.join(5)
    q.close()
    assert len(visited) == BUSY_SCANS
    first_wait = script.log.index(("watching", 41))
    reads = [n for what, n in script.log[:first_wait] if what == "version"]
    # The first scan (nothing found before it) reads them; the busy ones after it do not;
    # the scan after the last busy one found nothing without them, so the next is made
    # with them read before its peek: the one the wait trusts.
    assert reads == [0, BUSY_SCANS + 1], script.log
    peeks_before_wait = [n for what, n in script.log[:first_wait] if what == "peek"]
    assert peeks_before_wait[-1] == BUSY_SCANS + 2, script.log

"""A configured scanner election (Redis, memcached) that stops answering mid-run: the
store's own election takes over, so the queue keeps exactly one in-order scanner, and
hands back when the server returns (issue 27 point 1.3, part 4).

Three consumers, each on its own ``Quick`` of one SQLite file with its own election
client (as three ``quick worker --election ...`` processes have); the server is stopped
and started again under them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.runtime import Consumer
from quickzones.store.admin import stats
from quickzones.urls import open_election
from tests.scanner_fleet import TTL_S as FLEET_TTL_S
from tests.scanner_fleet import Fleet, started
from tests.waiting import wait_for

if TYPE_CHECKING:
    from integration.elections.conftest import Kit

TTL_S = 3.0
TAKES_OVER = "the store's election takes over"
HANDS_BACK = "the store's election hands back"


class Trio:
    """Three running consumers on one store, each with its own election client."""

    def __init__(self, url: str, election_url: str) -> None:
        self.quicks = [Quick.open(url) for _ in range(3)]
        config = ConsumerConfig(election_ttl_s=TTL_S, idle_sleep_s=0.05)
        self.consumers: list[Consumer] = [
            q.consumer(config, election=open_election(election_url), name=f"c{i}")
            for i, q in enumerate(self.quicks)
        ]
        for c in self.consumers:
            c.start()

    def in_order(self) -> list[str]:
        return [c.name for c in self.consumers if c.in_order]

    def watch(self, seconds: float) -> tuple[int, float]:
        """Sample who scans in order every 20 ms: the most at once, and the longest time
        with none."""
        most, gap, gap_since = 0, 0.0, None
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = time.monotonic()
            n = len(self.in_order())
            most = max(most, n)
            if n == 0:
                gap_since = now if gap_since is None else gap_since
                gap = max(gap, now - gap_since)
            else:
                gap_since = None
            time.sleep(0.02)
        return most, gap

    def holder(self) -> str | None:
        s = stats(self.quicks[0])
        lease = s.in_order_scanner
        return lease.holder if lease is not None and lease.held_at(s.read_at_ms) else None

    def close(self) -> None:
        for c in self.consumers:
            c.stop(1)
        for q in self.quicks:
            q.close()


@pytest.fixture
def trio(server_kit: Kit, tmp_path: Path) -> Iterator[Trio]:
    assert server_kit.server is not None
    t = Trio(f"sqlite:///{tmp_path / 'q.db'}", server_kit.server.url)
    try:
        yield t
    finally:
        t.close()


def _one(trio: Trio) -> bool:
    return len(trio.in_order()) == 1


def test_store_election_takes_over_while_the_configured_one_is_down_and_hands_back(
    server_kit: Kit, trio: Trio, caplog: pytest.LogCaptureFixture
) -> None:
    assert server_kit.server is not None
    caplog.set_level(logging.INFO, logger="quick.consumer")
    assert wait_for(lambda: _one(trio))
    before = trio.in_order()[0]
    assert trio.holder() == before

    server_kit.server.stop()
    most, gap = trio.watch(3 * TTL_S)
    assert len(trio.in_order()) == 1, f"{len(trio.in_order())} in-order scanners while down"
    assert most == 1, f"{most} in-order scanners at once while the server was down"
    assert gap < TTL_S, f"no in-order scanner for {gap:.1f}s while the server was down"
    assert trio.in_order() == [before]  # the holder kept the store's lease: no gap at all
    taking_over = [r for r in caplog.records if TAKES_OVER in r.getMessage()]
    assert len(taking_over) == 3, [r.getMessage() for r in taking_over]  # once per consumer

    server_kit.server.start()
    assert wait_for(lambda: sum(HANDS_BACK in r.getMessage() for r in caplog.records) == 3)
    most, gap = trio.watch(3 * TTL_S)
    assert most == 1, f"{most} in-order scanners at once after the server came back"
    assert gap < TTL_S, f"no in-order scanner for {gap:.1f}s after the server came back"
    assert wait_for(lambda: _one(trio) and trio.holder() == trio.in_order()[0])
    assert sum(TAKES_OVER in r.getMessage() for r in caplog.records) == 3


# --- the same with real ``quick worker --election URL`` processes ------------------------


def test_quick_workers_keep_one_in_order_scanner_while_the_election_server_is_down(
    server_kit: Kit, tmp_path: Path
) -> None:
    assert server_kit.server is not None
    fleet = Fleet(tmp_path, f"sqlite:///{tmp_path / 'q.db'}")
    try:
        workers = started(fleet, 3, "--election", server_kit.server.url)
        assert [w.gauge() for w in fleet.claimants()] == [1.0]
        holder = fleet.holder()

        server_kit.server.stop()
        assert wait_for(lambda: all(TAKES_OVER in w.text() for w in workers))
        time.sleep(2 * FLEET_TTL_S)  # several refreshes each, the server still down
        assert [w.name for w in fleet.claimants()] == [holder]
        assert sorted(w.gauge() or 0.0 for w in workers) == [0.0, 0.0, 1.0]
        assert fleet.holder() == holder
        assert [w.text().count(TAKES_OVER) for w in workers] == [1, 1, 1]  # not per scan

        server_kit.server.start()
        assert wait_for(lambda: all(HANDS_BACK in w.text() for w in workers))
        time.sleep(2 * FLEET_TTL_S)
        (claimant,) = fleet.claimants()
        assert fleet.holder() == claimant.name
        assert sorted(w.gauge() or 0.0 for w in workers) == [0.0, 0.0, 1.0]
        assert [w.text().count(HANDS_BACK) for w in workers] == [1, 1, 1]
    finally:
        fleet.stop()

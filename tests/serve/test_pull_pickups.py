"""Issue 31 point 6: items leased by remote workers through ``quick serve`` count in the
fairness view's pickup latencies as a local consumer's do (the server adds its pull
leases' pickup counts to the store every ``HEARTBEAT_S``, passed in as 0.2 s here, and
once more as it stops)."""

from __future__ import annotations

from pathlib import Path

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteQuick
from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.consumer.pull_leaser import PullLeaser
from quickzones.store import pickups
from tests.waiting import wait_for

from .conftest import ServerThread


def _picked(q: Quick) -> dict[str, int]:
    found = pickups.tenant_pickups(q.kv, q.keys, "a", now_ms(q.clock))
    return {tenant: h.total for tenant, h in found.items()}


def test_pull_leases_reach_the_pickup_summaries(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'pull.db'}")
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["produce", "consume"])[0]
    for tenant in ("t1", "t2", "t2"):
        q.enqueue("job", tenant, app="a", tenant=tenant)
    try:
        app = create_app(q, heartbeat_s=0.2)
        with ServerThread(app) as server, RemoteQuick(server.url, token) as rq:
            leased = []
            while len(leased) < 3:
                leased += rq.lease(app="a", job_types=["job"], max_items=3, wait_s=2)
            assert wait_for(lambda: _picked(q) == {"t1": 1, "t2": 2})
            rq.enqueue("job", "late", app="a", tenant="t3")
            assert rq.lease(app="a", job_types=["job"], wait_s=2)
        # Counted by the time the server stopped (its last flush runs as it stops).
        assert _picked(q) == {"t1": 1, "t2": 2, "t3": 1}
    finally:
        q.close()


def test_a_pull_leases_pickup_is_counted_from_when_the_item_vested(tmp_path: Path) -> None:
    """Issue 41 point 10 on the pull path: a delay asked for is not waiting. Before, an
    item delayed 5 s and leased as it vested showed 5 s of pickup to the server's
    dashboard figure, its remote lease and the fairness counts."""
    clock = ManualClock(1_700_000_000.0)
    q = Quick(MemoryStore(clock=clock), clock=clock)
    q.enqueue("job", 1, app="a", tenant="t", delay=5.0)
    leaser = PullLeaser(q)
    clock.advance(5.0)
    [leased] = leaser.lease_once("a", 10, 30.0)
    assert leased.item.vested_ms is not None
    assert leaser.pickup_percentiles() == (0, 0)
    leaser.pickup_counts.flush([(leaser.cluster.name, q.kv, q.keys)], now_ms(clock))
    [summary] = pickups.tenant_pickups(q.kv, q.keys, "a", now_ms(clock)).values()
    assert summary.total == 1 and summary.percentile(0.99) < 100, summary

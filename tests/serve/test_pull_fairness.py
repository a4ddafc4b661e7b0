"""The pull leaser of ``quick serve`` follows tenant weights and per-tenant limits as a
local consumer's visits do (issue 31 points 1 and 2 for remote workers): a tenant's
``max_running`` holds across remote workers, and weights 3:1 give leases 3:1.

On the unchanged code (pull leases followed neither): two remote workers of 2 workers
each ran 4 items of a tenant limited to 2 at once, and weights 3:1 gave leases 1:1
(600:600 of 1,200 leases of 20; now 2.79 to 3.26 over 2,000 leases of 10).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.pull_leaser import PullLeaser
from quickzones.registry import JobContext

from .conftest import Served


def test_a_tenant_limit_holds_across_two_remote_workers(served: Served) -> None:
    served.q.set_tenant_limit("a", "t", max_running=2)
    handlers = Quick.open("memory://")
    lock = threading.Lock()
    running = 0
    most = 0
    ran: list[str] = []

    @handlers.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.1)
        with lock:
            running -= 1
            ran.append(ctx.item_id)

    ids = {served.q.enqueue("job", n, app="a", tenant="t") for n in range(24)}
    clients = [RemoteQuick(served.url, served.a_all) for _ in range(2)]
    workers = [
        RemoteWorker(handlers.registry, c, workers=2, lease_s=5.0, wait_s=0.2) for c in clients
    ]
    threads = [threading.Thread(target=w.run_forever, daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while len(set(ran)) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(30)
        for w in workers:
            w.close()
        for c in clients:
            c.close()
        handlers.close()
    assert set(ran) == ids
    assert most <= 2, f"{most} of tenant t ran at once under max_running=2"


def test_weights_3_to_1_give_pull_leases_3_to_1(served: Served) -> None:
    served.q.set_weight("a", "gold", 3)
    # Backlogs that outlast the count: both tenants contend throughout.
    served.q.enqueue_many("job", range(2000), app="a", tenant="gold")
    served.q.enqueue_many("job", range(1000), app="a", tenant="plain")
    leased: Counter[str] = Counter()
    with RemoteQuick(served.url, served.a_all) as client:
        while sum(leased.values()) < 2000:
            got = client.lease(10, lease_s=600.0, wait_s=1.0)
            assert got, f"nothing leased after {dict(leased)}"
            leased.update(x.tenant for x in got)
    ratio = leased["gold"] / leased["plain"]
    # 2,000 leases taken ten at a time from weighted random draws: 48 runs over the three
    # stores gave 2.79 to 3.26 (before the first scan weighed the zones not yet visited,
    # 60 runs gave 2.52 to 3.20, the low ones a lead the plain tenant took while the
    # leaser did not know gold's weight). The 3:1-within-10 % target is measured over a
    # minute by bench.weights.
    assert 2.55 <= ratio <= 3.45, f"gold:plain {dict(leased)} = {ratio:.2f}"


def test_a_new_pull_leasers_first_lease_follows_the_weights() -> None:
    """A pull leaser knows each vested pointer's zone from its first scan, so its first
    draw is weighted too. It weighed only the zones it had visited (every other pointer
    as 1), so a weight-1 tenant's zone was drawn first half the time and, as a stride
    scheduler starts a zone it meets level with those it knows, the lead plain took while
    gold was unknown was never given back: of fresh leasers over two backlogs (gold
    weight 3), 200 of 400 first leases went to gold, and 2,000 leases ended 2.5:1 about
    one run in thirty. Deterministic: each leaser's draws are seeded."""
    q = Quick.open("memory://")
    try:
        q.set_weight("a", "gold", 3)
        q.enqueue_many("job", range(500), app="a", tenant="gold")
        q.enqueue_many("job", range(500), app="a", tenant="plain")
        first: Counter[str] = Counter()
        for seed in range(400):
            leaser = PullLeaser(q, ConsumerConfig(seed=seed))
            (got,) = leaser.lease_once("a", 1, lease_s=600.0)
            first[got.zone.tenant] += 1
    finally:
        q.close()
    # 3:1 draws: 300 of 400 expected, about 9 either side.
    assert 270 <= first["gold"] <= 330, dict(first)


def test_a_remote_items_tenant_slot_is_freed_by_its_completion_or_its_lapsed_lease(
    served: Served,
) -> None:
    """Under max_running=1: a second item is leased only once the first is completed, and
    an item whose remote worker vanished (its lease lapsed) frees the slot for the next."""
    served.q.set_tenant_limit("a", "t", max_running=1)
    ids = {served.q.enqueue("job", n, app="a", tenant="t") for n in range(3)}
    with RemoteQuick(served.url, served.a_all) as client:
        [first] = client.lease(5, lease_s=30.0, wait_s=1.0)
        assert client.lease(5, lease_s=30.0, wait_s=0.5) == []  # at its limit
        client.complete(first)
        [second] = client.lease(5, lease_s=1.0, wait_s=5.0)
        # Its worker never comes back: once its lease lapses, its item (or the third)
        # may be leased, never two at once.
        got = client.lease(5, lease_s=30.0, wait_s=15.0)
        assert len(got) == 1
        assert {first.item_id, second.item_id, got[0].item_id} <= ids

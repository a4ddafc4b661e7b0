"""The pull API admits items by the same rules as a local consumer's visits (issue 40
point 7): an app's pool-wide ``max_concurrency`` and ``dispatches_per_second``
(:class:`~quickzones.store.limits.AppLimits`) hold for ``POST /v1/leases`` as they hold
for a consumer, because both ask the one fetcher (:mod:`quickzones.consumer.fetcher`).

On the unchanged code the pull leaser built its visits without the app's limits: an app
limited to 1 running item got 5 items leased by one ``POST /v1/leases`` of 5, and a
dispatch rate of 2 a second let 12 items out in one window. (Tenant limits, weights and
pauses through the pull API: test_pull_fairness.py, test_pause_http.py.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from quickzones.registry import JobContext
from quickzones.store.limits import AppLimits

from .conftest import Served


def test_an_app_limited_to_one_running_item_is_leased_one_at_a_time(served: Served) -> None:
    served.q.set_limits("a", AppLimits(max_concurrency=1))
    ids = {served.q.enqueue("job", n, app="a", tenant=f"t{n % 3}") for n in range(6)}
    with RemoteQuick(served.url, served.a_all) as client:
        first = client.lease(5, lease_s=30.0, wait_s=1.0)
        assert len(first) == 1, f"{len(first)} items leased under max_concurrency=1"
        assert client.lease(5, lease_s=30.0, wait_s=0.3) == []  # one is running
        client.complete(first[0])
        # Its completion frees the app's slot: the next is leased, still one at a time.
        second = client.lease(5, lease_s=30.0, wait_s=5.0)
        assert len(second) == 1
        assert client.lease(5, lease_s=30.0, wait_s=0.3) == []
        # A nack (a retry) ends its run as well.
        client.nack(second[0], delay_s=0.0)
        third = client.lease(5, lease_s=30.0, wait_s=5.0)
        assert len(third) == 1
        client.fail(third[0], "no")  # a dead letter too
        fourth = client.lease(5, lease_s=30.0, wait_s=5.0)
        assert len(fourth) == 1
        assert {x.item_id for x in first + second + third + fourth} <= ids


def test_an_app_limited_to_one_running_item_frees_its_slot_when_a_lease_lapses(
    served: Served,
) -> None:
    """A remote worker that vanished: once its item's lease lapses, the next is leased."""
    served.q.set_limits("a", AppLimits(max_concurrency=1))
    for n in range(3):
        served.q.enqueue("job", n, app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        assert len(client.lease(5, lease_s=1.0, wait_s=1.0)) == 1
        got = client.lease(5, lease_s=30.0, wait_s=15.0)
        assert len(got) == 1


def test_an_apps_dispatch_rate_holds_for_pull_leases(served: Served) -> None:
    served.q.set_limits("a", AppLimits(dispatches_per_second=2))
    for n in range(12):
        served.q.enqueue("job", n, app="a", tenant=f"t{n % 4}")
    leased = 0
    with RemoteQuick(served.url, served.a_all) as client:
        start = time.time()
        leased += len(client.lease(12, lease_s=60.0, wait_s=0.0))
        leased += len(client.lease(12, lease_s=60.0, wait_s=0.0))
        end = time.time()
    # The rate's windows are whole seconds: those this span touched allow 2 each.
    windows = int(end) - int(start) + 1
    assert 1 <= leased <= 2 * windows, f"{leased} leased in {windows} window(s) at 2/s"


def test_a_job_types_pool_cap_holds_across_remote_workers(served: Served) -> None:
    """``pool_max_concurrency=1``: two remote workers of 3 workers each run one item of
    the type at a time (on main: 6 ran at once; the remote workers' Worker had no limits
    store to take the type's slot from)."""
    handlers = Quick.open("memory://")
    lock = threading.Lock()
    running = most = 0
    ran: list[str] = []

    @handlers.job("capped", pool_max_concurrency=1)
    def capped(payload: Any, ctx: JobContext) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
            ran.append(ctx.item_id)

    ids = {served.q.enqueue("capped", n, app="a", tenant=f"t{n % 4}") for n in range(8)}
    clients = [RemoteQuick(served.url, served.a_all) for _ in range(2)]
    workers = [
        RemoteWorker(handlers.registry, c, workers=3, lease_s=10.0, wait_s=0.2) for c in clients
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
    assert most == 1, f"{most} items of a type capped at 1 ran at once"

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

import time

from quickzones.adapters.http.client import RemoteQuick
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

"""Real ``quick worker`` processes on one store: exactly one of them is the in-order
(sequential) scanner of the top-level queue, the paper's no-starvation condition (issue 27
point 1.3). A SIGKILLed holder is replaced after its TTL; a SIGSTOPped one that wakes after
losing it stops scanning in order.

What a worker considers itself is read from the outside, as an operator would: its log
(``quick -v``: "is the in-order scanner" / "lost the in-order scanner lease") and its
Prometheus gauge ``quick_in_order_scanner``; who holds the lease from ``quick stats``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url
from tests.scanner_fleet import TTL_S, Fleet, started
from tests.waiting import wait_for

PROCESS_BACKENDS = [
    "sqlite",
    *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else []),
    *(["postgres"] if HAVE_POSTGRES else []),
]


@pytest.fixture(params=PROCESS_BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path, store_url(str(request.param), tmp_path))
    try:
        yield f
    finally:
        f.stop()


def test_three_workers_on_one_store_have_one_in_order_scanner(fleet: Fleet) -> None:
    workers = started(fleet, 3)
    claimants = fleet.claimants()
    assert len(claimants) == 1, f"{len(claimants)} of 3 workers scan in order"
    assert fleet.holder() == claimants[0].name
    assert f"in-order scanner: {claimants[0].name} (term " in fleet.quick("stats")
    gauges = [w.gauge() for w in workers]
    assert sorted(gauges) == [0.0, 0.0, 1.0], gauges
    assert claimants[0].gauge() == 1.0


def test_killed_holder_is_replaced_after_its_ttl(fleet: Fleet) -> None:
    workers = started(fleet, 3)
    (holder,) = fleet.claimants()
    term = fleet.stats()["in_order_scanner"]
    holder.proc.kill()
    holder.proc.wait(10)
    others = [w for w in workers if w is not holder]
    assert wait_for(lambda: fleet.holder() in {w.name for w in others}), fleet.stats()
    (successor,) = fleet.claimants(others)
    assert fleet.holder() == successor.name
    after = fleet.stats()["in_order_scanner"]
    assert isinstance(term, dict) and isinstance(after, dict)
    assert after["term"] > term["term"]


def test_stopped_holder_that_wakes_deposed_stops_scanning_in_order(fleet: Fleet) -> None:
    workers = started(fleet, 3)
    (holder,) = fleet.claimants()
    holder.proc.send_signal(signal.SIGSTOP)
    others = [w for w in workers if w is not holder]
    assert wait_for(lambda: fleet.holder() in {w.name for w in others}), fleet.stats()
    successor_name = fleet.holder()
    holder.proc.send_signal(signal.SIGCONT)
    assert wait_for(lambda: not holder.claims()), holder.text()
    assert holder.gauge() == 0.0
    time.sleep(TTL_S)  # the woken one has refreshed its view more than once
    claimants = fleet.claimants()
    assert [w.name for w in claimants] == [successor_name]
    assert fleet.holder() == successor_name

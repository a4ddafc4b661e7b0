"""Real ``quick worker`` processes on one store: exactly one of them is the in-order
(sequential) scanner of the top-level queue, the paper's no-starvation condition (issue 27
point 1.3). A SIGKILLed holder is replaced after its TTL; a SIGSTOPped one that wakes after
losing it stops scanning in order.

What a worker considers itself is read from the outside, as an operator would: its log
(``quick -v``: "is the in-order scanner" / "lost the in-order scanner lease") and its
Prometheus gauge ``quick_in_order_scanner``; who holds the lease from ``quick stats``.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.clock import ManualClock
from quickzones.consumer.election import LocalElection
from quickzones.consumer.scanner_election import ScannerElection, lease_name
from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url
from tests.scanner_fleet import Fleet, renewals_seen, started
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
    # The gauge is set before the log line that says the lease was lost is written.
    assert holder.gauge() == 0.0
    # The successor renews three times (a TTL): the woken one refreshed its view as often.
    assert renewals_seen(fleet, 3), fleet.stats()
    claimants = fleet.claimants()
    assert [w.name for w in claimants] == [successor_name]
    assert fleet.holder() == successor_name


def test_the_gauge_says_lost_before_the_log_line_does(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 40 point 0: the lost-lease log line was written before the gauge was set, so
    an operator (or the test above) who read the line and then the gauge could see 1."""
    clock = ManualClock()
    table = LocalElection(clock)
    order: list[str] = []

    def emit(event: str, **fields: object) -> None:
        order.append(f"gauge {int(bool(fields['held']))}")

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            order.append(record.getMessage().split(" ", 2)[2])

    lines = Lines()
    logging.getLogger("quick.consumer").addHandler(lines)
    caplog.set_level(logging.INFO, "quick.consumer")
    try:
        holder = ScannerElection({"default": table}, "a", clock, ttl_s=5, emit=emit)
        holder.refresh(["default"])
        clock.advance(6)  # a holder stopped past its lease
        assert table.try_acquire(lease_name("default"), "b", 5) is not None
        holder.refresh(["default"])
    finally:
        logging.getLogger("quick.consumer").removeHandler(lines)
    assert order == [
        "gauge 1",
        "is the in-order scanner of default (term 1)",
        "gauge 0",
        "lost the in-order scanner lease",
    ]

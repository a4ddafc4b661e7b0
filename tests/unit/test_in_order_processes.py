"""Exactly one in-order scanner among real ``quick worker`` processes (issue 40 point 5):
the children of ``quick worker --processes N`` (one supervisor; this already held on main,
each child being a consumer of its own), and workers all routed to one app (``--apps a``:
on main none of them scanned in order). Read as an operator does: the log, the metrics
endpoint and ``quick stats``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from quickzones.client import Quick
from quickzones.consumer.scanner_election import route_of
from quickzones.testing.provision.ports import free_port
from tests.scanner_fleet import APP, CLAIM, LOSS, Fleet, renewals_seen, started
from tests.waiting import wait_for


def _gauge(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    for line in body.splitlines():
        if line.startswith('quick_in_order_scanner{cluster="default"'):
            return float(line.split()[-1])
    return None


def test_processes_have_one_in_order_scanner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(url).close()
    (tmp_path / "scanapp.py").write_text(APP)
    fleet = Fleet(tmp_path, url)
    port = free_port()
    log = tmp_path / "supervisor.log"
    cmd = [sys.executable, "-m", "quickzones", "-v", "worker", "--app-module", "scanapp:q",
           "--processes", "3", "--workers", "1", "--managers", "1", "--metrics-port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env={**os.environ, "QUICK_STORE": url}, stdout=out, stderr=out
        )  # fmt: skip

    def names() -> set[str]:
        return set(re.findall(r"^quick worker (\w+):", log.read_text(), re.M))

    def claims() -> dict[str, bool]:
        """Each child's last word on the lease: whether it holds it."""
        last: dict[str, bool] = {}
        for line in log.read_text().splitlines():
            if CLAIM in line or LOSS in line:
                who = re.search(r"consumer (\w+) (?:is the|lost the)", line)
                assert who is not None, line
                last[who.group(1)] = CLAIM in line
        return last

    try:
        assert wait_for(lambda: len(names()) == 3), log.read_text()
        assert wait_for(lambda: any(claims().values())), log.read_text()
        assert renewals_seen(fleet, 3), fleet.stats()  # every child refreshed since
        holders = [name for name, held in claims().items() if held]
        assert len(holders) == 1, log.read_text()
        assert holders[0] in names()
        assert fleet.holder() == holders[0]
        assert _gauge(port) == 1.0  # one endpoint for all: 1 while any child holds it
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_workers_all_routed_to_one_app_have_one_in_order_scanner(tmp_path: Path) -> None:
    """``quick worker --apps a`` twice, no other consumer: one of them scans a's zones in
    order (on main neither did: routed consumers stayed out of the election)."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    fleet = Fleet(tmp_path, url)
    try:
        workers = started(fleet, 2, "--apps", "a")
        assert renewals_seen(fleet, 0, route=route_of(("a",), None)), fleet.stats()
        claimants = fleet.claimants()
        assert len(claimants) == 1, [w.text() for w in workers]
        assert sorted(w.gauge() or 0.0 for w in workers) == [0.0, 1.0]
        assert fleet.holder() is None  # the cluster's lease: nobody takes everything
    finally:
        fleet.stop()

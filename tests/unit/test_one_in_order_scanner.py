"""Real ``quick worker`` processes on one store: exactly one of them is the in-order
(sequential) scanner of the top-level queue, the paper's no-starvation condition (issue 27
point 1.3). A SIGKILLed holder is replaced after its TTL; a SIGSTOPped one that wakes after
losing it stops scanning in order.

What a worker considers itself is read from the outside, as an operator would: its log
(``quick -v``: "is the in-order scanner" / "lost the in-order scanner lease") and its
Prometheus gauge ``quick_in_order_scanner``; who holds the lease from ``quick stats``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.testing.provision.ports import free_port
from tests.conftest import HAVE_FDB, store_url
from tests.waiting import wait_for

APP = "import os\nfrom quickzones import Quick\nq = Quick.open(os.environ['QUICK_STORE'])\n"

CLAIM = "is the in-order scanner of"
LOSS = "lost the in-order scanner lease"
TTL_S = 5.0  # ConsumerConfig.election_ttl_s, what quick worker runs with


class Worker:
    """One ``quick -v worker`` process, its log file and its metrics port."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, port: int) -> None:
        self.proc = proc
        self.log = log
        self.port = port

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def name(self) -> str | None:
        for line in self.text().splitlines():
            if line.startswith("quick worker "):
                return line.split()[2].rstrip(":")
        return None

    def claims(self) -> bool:
        """Whether its log's last word on the lease is that it holds it."""
        last = None
        for line in self.text().splitlines():
            if CLAIM in line:
                last = True
            elif LOSS in line:
                last = False
        return bool(last)

    def gauge(self) -> float | None:
        """``quick_in_order_scanner{cluster="default"}`` from its metrics endpoint."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        for line in body.splitlines():
            if line.startswith('quick_in_order_scanner{cluster="default"}'):
                return float(line.split()[-1])
        return None


class Fleet:
    """The app module, its store, and the worker processes started on them."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.dir = tmp_path
        self.url = url
        (tmp_path / "scanapp.py").write_text(APP)
        self.workers: list[Worker] = []

    def start(self) -> Worker:
        n = len(self.workers)
        log = self.dir / f"worker-{n}.log"
        port = free_port()
        env = {**os.environ, "QUICK_STORE": self.url}
        cmd = [sys.executable, "-m", "quickzones", "-v", "worker", "--app-module", "scanapp:q"]
        cmd += ["--managers", "1", "--workers", "1", "--metrics-port", str(port)]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=self.dir, env=env, stdout=out, stderr=out)
        worker = Worker(proc, log, port)
        self.workers.append(worker)
        return worker

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def claimants(self, among: list[Worker] | None = None) -> list[Worker]:
        return [w for w in (among if among is not None else self.live()) if w.claims()]

    def stats(self) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "quickzones", "stats", "--json"],
            cwd=self.dir,
            env={**os.environ, "QUICK_STORE": self.url},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        parsed: dict[str, object] = json.loads(out.stdout)
        return parsed

    def holder(self) -> str | None:
        scanner = self.stats()["in_order_scanner"]
        assert isinstance(scanner, dict)
        return scanner["holder"] if scanner["held"] else None

    def stop(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
            w.proc.wait(10)


PROCESS_BACKENDS = ["sqlite", *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else [])]


@pytest.fixture(params=PROCESS_BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path, store_url(str(request.param), tmp_path))
    try:
        yield f
    finally:
        f.stop()


def _started(fleet: Fleet, n: int) -> list[Worker]:
    workers = [fleet.start() for _ in range(n)]
    assert wait_for(lambda: all(w.name for w in workers)), [w.text() for w in workers]
    # A first holder, then a few renewals, so every worker has had its say.
    assert wait_for(lambda: bool(fleet.claimants())), [w.text() for w in workers]
    time.sleep(TTL_S)
    return workers


def test_three_workers_on_one_store_have_one_in_order_scanner(fleet: Fleet) -> None:
    workers = _started(fleet, 3)
    claimants = fleet.claimants()
    assert len(claimants) == 1, f"{len(claimants)} of 3 workers scan in order"
    assert fleet.holder() == claimants[0].name
    gauges = [w.gauge() for w in workers]
    assert sorted(gauges) == [0.0, 0.0, 1.0], gauges
    assert claimants[0].gauge() == 1.0


def test_killed_holder_is_replaced_after_its_ttl(fleet: Fleet) -> None:
    workers = _started(fleet, 3)
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
    workers = _started(fleet, 3)
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

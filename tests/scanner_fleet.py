"""Real ``quick worker`` processes on one store, and what each says about the in-order
scanner election from the outside, as an operator sees it: its log (``quick -v``), its
Prometheus gauge ``quick_in_order_scanner``, and ``quick stats --json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.scanner_election import lease_name
from quickzones.consumer.store_election import StoreElection
from quickzones.testing.provision.ports import free_port
from tests.waiting import wait_for

# One job type: quick worker refuses a module that registers none (issue 41 point 3).
APP = (
    "import os\nfrom quickzones import Quick\nq = Quick.open(os.environ['QUICK_STORE'])\n"
    "q.job('noop')(lambda payload, ctx: None)\n"
)

CLAIM = "is the in-order scanner of"
LOSS = "lost the in-order scanner lease"
# The in-order scanner lease every worker of a fleet runs with: the default a user gets
# (ConsumerConfig.election_ttl_s). The tests wait for it to lapse or be renewed.
TTL_S = ConsumerConfig().election_ttl_s


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

    def start(self, *extra: str) -> Worker:
        """Start ``quick -v worker`` with ``extra`` options (e.g. ``--election URL``)."""
        n = len(self.workers)
        log = self.dir / f"worker-{n}.log"
        port = free_port()
        env = {**os.environ, "QUICK_STORE": self.url}
        cmd = [sys.executable, "-m", "quickzones", "-v", "worker", "--app-module", "scanapp:q"]
        cmd += ["--managers", "1", "--workers", "1", "--metrics-port", str(port)]
        cmd += [*extra]
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
        parsed: dict[str, object] = json.loads(self.quick("stats", "--json"))
        return parsed

    def quick(self, *args: str) -> str:
        """``quick ARGS`` on the fleet's store; its standard output."""
        out = subprocess.run(
            [sys.executable, "-m", "quickzones", *args],
            cwd=self.dir,
            env={**os.environ, "QUICK_STORE": self.url},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout

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


def started(fleet: Fleet, n: int, *extra: str) -> list[Worker]:
    """``n`` workers, once one of them holds the lease and every one has taken part in
    the election since (its gauge is published at its first refresh: a worker that
    refreshed while another held the lease did not get it)."""
    workers = [fleet.start(*extra) for _ in range(n)]
    assert wait_for(lambda: all(w.name for w in workers)), [w.text() for w in workers]
    assert wait_for(lambda: bool(fleet.claimants())), [w.text() for w in workers]
    assert wait_for(lambda: all(w.gauge() is not None for w in workers)), [
        w.text() for w in workers
    ]
    return workers


def renewals_seen(fleet: Fleet, count: int, *, route: str = "") -> bool:
    """Wait until the lease's holder has renewed it ``count`` times (each renewal, every
    ``TTL_S / 3``, moves its end; every other worker refreshes its view as often); with
    ``route``, the lease of the consumers routed so (read from the store)."""
    ends: set[object] = set()

    def renewed() -> bool:
        if route:
            q = Quick.open(fleet.url, create=False)
            try:
                lease = StoreElection(q.kv, q.keys, q.clock).read(lease_name("default", route))
            finally:
                q.close()
            ends.add(None if lease is None else lease.expires_ms)
            return lease is not None and len(ends) > count
        scanner = fleet.stats()["in_order_scanner"]
        assert isinstance(scanner, dict)
        ends.add(scanner["expires"])
        return len(ends) > count

    return wait_for(renewed)

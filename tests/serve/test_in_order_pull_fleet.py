"""A fleet of remote pull workers and no local consumer has exactly one in-order scanner
(issue 40 point 5): ``quick serve`` stands in its cluster's election for the workers that
pull through it. Before, such a fleet had none (the lease's holder stayed None) and every
pull scan chose at random, so nothing kept the oldest vested pointer from waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from quickzones.adapters.http import TokenStore
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.consumer.scanner_election import lease_name
from quickzones.consumer.store_election import StoreElection
from tests.waiting import wait_for

from .conftest import serve_process

ZONES = 6

HANDLERS = """
import os, time
from quickzones import Quick

from quickzones.adapters.http.in_order import IN_ORDER_EVERY_S

quick = Quick.open("memory://")  # only its handlers: the store is behind quick serve
RAN = os.environ["RAN"]

def note(tenant):
    with open(RAN, "a") as f:
        f.write(tenant + "\\n")

@quick.job("gate")
def gate(payload, ctx):
    note(ctx.tenant)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["GATE"]) and time.monotonic() < deadline:
        time.sleep(0.01)

@quick.job("step")
def step(payload, ctx):
    note(ctx.tenant)
    # Its work: the worker's next lease comes after the server's in-order scans' spacing.
    time.sleep(IN_ORDER_EVERY_S + 0.1)
"""


def _holder(q: Quick) -> str | None:
    lease = StoreElection(q.kv, q.keys, q.clock).read(lease_name(q.toplevel.cluster))
    return lease.holder if lease is not None and lease.held_at(now_ms(q.clock)) else None


def test_pull_only_fleet_has_one_in_order_scanner_that_takes_the_oldest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(url)
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["consume"])[0]
    (tmp_path / "pull_handlers.py").write_text(HANDLERS)
    ran, gate = tmp_path / "ran.txt", tmp_path / "gate"
    env = {**os.environ, "QUICK_TOKEN": token, "RAN": str(ran), "GATE": str(gate)}

    def lines() -> list[str]:
        return ran.read_text().split() if ran.exists() else []

    q.enqueue("gate", None, app="a", tenant="gate")
    with serve_process(url) as (server, _):
        worker = subprocess.Popen(
            [sys.executable, "-m", "quickzones", "worker", "--app-module", "pull_handlers",
             "--remote", server, "--workers", "1"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            # The worker pulls: the server stands for the in-order scanner and is elected.
            assert wait_for(lambda: (_holder(q) or "").startswith("serve-")), _holder(q)
            assert wait_for(lambda: lines() == ["gate"]), lines()
            # While the one worker runs the gate, a backlog: one zone each, each vesting
            # 10 ms after the one before.
            for n in range(ZONES):
                q.enqueue("step", n, app="a", tenant=f"t{n:02d}", delay=0.01 * n)
            all_vested_ms = now_ms(q.clock) + 10 * ZONES
            assert wait_for(lambda: now_ms(q.clock) > all_vested_ms)
            gate.touch()
            assert wait_for(lambda: len(lines()) == ZONES + 1), lines()
            assert (_holder(q) or "").startswith("serve-")
        finally:
            gate.touch()  # its handler ends: the worker stops at once
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
    # Taken in order: the oldest vested pointer first, every time (at random, 6 zones
    # come out in their vesting order once in 6! = 720 runs).
    assert lines()[1:] == [f"t{n:02d}" for n in range(ZONES)], (lines(), err)
    q.close()

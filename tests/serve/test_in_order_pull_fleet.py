"""A fleet of remote pull workers and no local consumer has exactly one in-order scanner
(issue 40 point 5): ``quick serve`` stands in its cluster's election for the workers that
pull through it. Before, such a fleet had none (the lease's holder stayed None) and every
pull scan chose at random, so nothing kept the oldest vested pointer from waiting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quickzones.adapters.http import TokenStore
from quickzones.adapters.http.in_order import IN_ORDER_EVERY_S, ServeInOrder
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.consumer.config import ConsumerConfig
from quickzones.consumer.pull_leaser import PullLeaser
from quickzones.consumer.scanner_election import lease_name
from quickzones.consumer.store_election import StoreElection
from quickzones.store.records import ZoneId
from tests.waiting import wait_for

from .conftest import serve_process

ZONES = 6

HANDLERS = """
import os, time
from quickzones import Quick

from quickzones.adapters.http.in_order import IN_ORDER_EVERY_S, ServeInOrder

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
            gate_began = time.monotonic()
            # While the one worker runs the gate, a backlog: one zone each, each vesting
            # 10 ms after the one before.
            for n in range(ZONES):
                q.enqueue("step", n, app="a", tenant=f"t{n:02d}", delay=0.01 * n)
            all_vested_ms = now_ms(q.clock) + 10 * ZONES
            assert wait_for(lambda: now_ms(q.clock) > all_vested_ms)
            # The server scans in order at most once every IN_ORDER_EVERY_S (by design:
            # its other scans are random so that concurrent pulls spread). The gate's own
            # pull may have been that scan: the worker's next pull comes after the
            # spacing, as each step's does.
            time.sleep(max(0.0, gate_began + IN_ORDER_EVERY_S + 0.2 - time.monotonic()))
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


class _Ticks:
    """A monotonic clock the test moves: the server's in-order scans are spaced in it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _elected(q: Quick, ticks: _Ticks) -> ServeInOrder:
    serving = ServeInOrder(q, ConsumerConfig(), clock=ticks)
    serving.scan_in_order()  # a worker pulls: the server stands
    serving.refresh()
    assert serving.holds()
    return serving


def _backlog(q: Quick, zones: int) -> list[str]:
    """One item in each of ``zones`` zones, each vesting a few ms after the one before;
    returns the tenants oldest first, once all vested."""
    tenants = [f"t{n:02d}" for n in range(zones)]
    for n, tenant in enumerate(tenants):
        q.enqueue("step", n, app="a", tenant=tenant, delay=0.003 * n)
    until = now_ms(q.clock) + 3 * zones + 5
    assert wait_for(lambda: now_ms(q.clock) > until)
    return tenants


def test_the_servers_heartbeat_takes_no_in_order_turn(tmp_path: Path) -> None:
    """The heartbeat reports whether the server is the in-order scanner; asking took the
    turn of the next in-order scan, so a worker's pull just after a heartbeat was a random
    one (CI saw ``t04`` leased before ``t03``)."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    ticks = _Ticks()
    serving = _elected(q, ticks)
    leaser = PullLeaser(q, ConsumerConfig(), in_order=serving.scan_in_order, leads=serving.holds)
    oldest_first = _backlog(q, 8)
    taken: list[str] = []
    for _ in oldest_first:
        ticks.now += IN_ORDER_EVERY_S + 0.5  # past the spacing: the next scan is in order
        leaser.pull_runs.heartbeats.beat_once()  # reports the server as the scanner
        taken += [x.zone.tenant for x in leaser.lease_once("a", 1, 30.0)]
    assert taken == oldest_first
    q.close()


def test_an_in_order_scan_is_in_order_on_every_shard(tmp_path: Path) -> None:
    """A store of several shards: the scan asked whether it is in order once per shard,
    and quick serve's spacing answered yes for the first shard only; the other shards'
    pointers were sampled at random and came after it, so the oldest pointer of the
    cluster could wait."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}", shards=4)
    ticks = _Ticks()
    serving = _elected(q, ticks)
    leaser = PullLeaser(q, ConsumerConfig(), in_order=serving.scan_in_order, leads=serving.holds)
    oldest_first = _backlog(q, 12)
    assert len({q.toplevel.shard_for(ZoneId("a", t)) for t in oldest_first}) > 1
    ticks.now += IN_ORDER_EVERY_S + 0.5
    taken = [x.zone.tenant for x in leaser.lease_once("a", 4, 30.0)]
    assert taken == oldest_first[:4]
    q.close()

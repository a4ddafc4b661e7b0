"""Per-tenant limits (issue 31 point 2), from the user's side: ``Quick.set_tenant_limit``
(at most N items of a tenant, or of a tenant and job type, running across every
consumer; at most N starts per period), the ``quick limit`` CLI and ``quick worker``
processes. An item held back waits with no attempt counted, and other tenants run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quickzones.aio import AsyncQuick
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import InvalidArgument
from quickzones.store.tenant_limits import TenantLimit
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")


# --- concurrency ------------------------------------------------------------------------


def _workers(tmp_path: Path, db: Path, n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` ``quick worker`` processes whose handler writes 'tenant start end' lines. The
    quiet tenant's first items wait (up to 20 s) until three of them run at once, so that
    a host too busy to start them together by chance cannot pass for a limit held against
    them: only a limit on that tenant keeps the third from starting."""
    (tmp_path / "limited.py").write_text(
        "import os, time\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        f"MARKS = {str(tmp_path / 'quiet-running')!r}\n"
        "os.makedirs(MARKS, exist_ok=True)\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        "    start = time.time()\n"
        "    if ctx.zone.tenant == 'quiet':\n"
        "        open(os.path.join(MARKS, ctx.item.item_id), 'w').close()\n"
        "        while len(os.listdir(MARKS)) < 3 and time.time() < start + 20:\n"
        "            time.sleep(0.01)\n"
        "    time.sleep(0.05)\n"
        f"    with open({str(tmp_path / 'spans.txt')!r}, 'a') as f:\n"
        "        f.write(f'{ctx.zone.tenant} {start} {time.time()}\\n')\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    cmd = [str(QUICK), "worker", "--app-module", "limited", "--workers", "4"]
    return [
        subprocess.Popen(
            [*cmd, "--shutdown-deadline", "5"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def _spans(tmp_path: Path) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    path = tmp_path / "spans.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        tenant, start, end = line.split()
        out.setdefault(tenant, []).append((float(start), float(end)))
    return out


def test_a_tenant_limited_to_2_running_never_runs_3_across_2_worker_processes(
    tmp_path: Path,
) -> None:
    """(Unchanged code, no limit: 4 of the tenant's items ran at once.)"""
    db = tmp_path / "w.db"
    q = Quick.open(f"sqlite:///{db}")
    try:
        q.set_tenant_limit("a", "noisy", max_running=2)
        q.enqueue_many("j", list(range(60)), app="a", tenant="noisy")
        q.enqueue_many("j", list(range(20)), app="a", tenant="quiet")
        procs = _workers(tmp_path, db, 2)
        try:
            assert wait_for(lambda: sum(map(len, _spans(tmp_path).values())) >= 80, 120)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
        spans = _spans(tmp_path)
        assert len(spans["noisy"]) == 60 and len(spans["quiet"]) == 20
        assert most_at_once(spans["noisy"]) == 2
        assert most_at_once(spans["quiet"]) > 2  # others are not held to it
        # The quiet tenant was not held behind the noisy one's backlog.
        assert max(e for _, e in spans["quiet"]) < max(e for _, e in spans["noisy"])
    finally:
        q.close()


def test_a_tenant_and_job_type_limit_holds_only_that_type(live_q: Quick) -> None:
    q = live_q
    running = {"report": 0, "mail": 0}
    most = {"report": 0, "mail": 0}
    lock = threading.Lock()

    def handler(payload: Any, ctx: Any) -> None:
        with lock:
            running[ctx.item.job_type] += 1
            most[ctx.item.job_type] = max(most[ctx.item.job_type], running[ctx.item.job_type])
        time.sleep(0.02)
        with lock:
            running[ctx.item.job_type] -= 1

    q.job("report", keep_status_s=600)(handler)
    q.job("mail", keep_status_s=600)(handler)
    q.set_tenant_limit("a", "t", job_type="report", max_running=1)
    reports = q.enqueue_many("report", list(range(10)), app="a", tenant="t")
    mails = q.enqueue_many("mail", list(range(30)), app="a", tenant="t")
    consumer = q.consumer(ConsumerConfig(workers=8, idle_sleep_s=0.01))
    consumer.start()
    try:
        assert wait_for(lambda: all(_state(q, i) == "completed" for i in reports + mails), 120)
    finally:
        consumer.stop()
    assert most["report"] == 1 and most["mail"] > 1
    assert all(q.status("a", "t", i).attempts == 1 for i in reports)  # type: ignore[union-attr]


def _state(q: Quick, item_id: str) -> str | None:
    status = q.status("a", "t", item_id)
    return None if status is None else status.state


# --- rate -------------------------------------------------------------------------------


def test_a_rate_limit_of_10_a_second_holds_and_counts_no_attempt(live_q: Quick) -> None:
    """61 items at 10/s over two consumers: the first to the last start take at least
    6 s less 5 % (unchanged code, no limit: all 61 started within 0.002 s); each ran once;
    another tenant's 50 items are not held behind them."""
    q = live_q
    starts: dict[str, list[float]] = {"slow": [], "other": []}
    lock = threading.Lock()

    def handler(payload: Any, ctx: Any) -> None:
        with lock:
            starts[ctx.tenant].append(time.monotonic())

    q.job("j", keep_status_s=600)(handler)
    q.set_tenant_limit("a", "slow", rate=10, per=1.0)
    held = q.enqueue_many("j", list(range(61)), app="a", tenant="slow")
    q.enqueue_many("j", list(range(50)), app="a", tenant="other")
    consumers = [q.consumer(ConsumerConfig(workers=4, idle_sleep_s=0.01)) for _ in range(2)]
    for c in consumers:
        c.start()
    try:
        assert wait_for(lambda: len(starts["slow"]) >= 61 and len(starts["other"]) >= 50, 120)
        time.sleep(0.3)  # nothing more starts
    finally:
        for c in consumers:
            c.stop()
    slow = sorted(starts["slow"])
    assert len(slow) == 61
    rate = (len(slow) - 1) / (slow[-1] - slow[0])
    assert rate <= 10 * 1.05, rate
    assert max(starts["other"]) < slow[30]  # the other tenant finished long before
    assert all(q.status("a", "slow", i).attempts == 1 for i in held)  # type: ignore[union-attr]


def test_held_back_items_count_no_attempt_while_they_wait(q: Quick, clock: ManualClock) -> None:
    ran: list[str] = []
    q.job("j")(lambda payload, ctx: ran.append(ctx.tenant))
    q.set_tenant_limit("a", "t", rate=2, per=60.0)
    items = q.enqueue_many("j", list(range(5)), app="a", tenant="t")
    q.enqueue("j", b"", app="a", tenant="u")
    q.run_until_idle()
    # Starts are spaced evenly (one each 30 s) with a burst of a tenth of the rate (1).
    assert sorted(ran) == ["t", "u"]
    waiting = [i for i in items if _state(q, i) == "queued"]
    assert len(waiting) == 4
    assert all(q.status("a", "t", i).attempts == 0 for i in waiting)  # type: ignore[union-attr]
    clock.advance(30)
    q.run_until_idle()
    assert ran.count("t") == 2
    clock.advance(60)
    q.run_until_idle()
    assert ran.count("t") == 3  # the burst holds one: no catching up on time away
    assert q.dead_letters() == []


# --- the API, its checks and the CLI ------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"max_running": 0},
        {"max_running": -1},
        {"max_running": 2.5},
        {"max_running": True},
        {"rate": 0},
        {"rate": 10, "per": 0},
        {"rate": 10, "per": float("nan")},
        {"rate": 10, "per": -1},
        {"rate": 10**9},
        {},
    ],
)
def test_a_bad_limit_is_refused_and_stores_nothing(q: Quick, bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        q.set_tenant_limit("a", "t", **bad)
    assert q.tenant_limits() == []


def test_limits_are_listed_replaced_and_cleared(q: Quick) -> None:
    q.set_tenant_limit("a", "t", max_running=3)
    q.set_tenant_limit("a", "t", job_type="report", max_running=1, rate=5, per=60)
    q.set_tenant_limit("a", "t", max_running=4)  # replaces
    assert q.tenant_limits() == [
        TenantLimit("a", "t", None, max_running=4),
        TenantLimit("a", "t", "report", max_running=1, rate=5, per_s=60.0),
    ]
    assert q.clear_tenant_limit("a", "t", job_type="report") is True
    assert q.clear_tenant_limit("a", "t", job_type="report") is False
    assert q.tenant_limits() == [TenantLimit("a", "t", None, max_running=4)]


def test_async_quick_sets_and_lists_limits(q: Quick) -> None:
    aq = AsyncQuick(q)

    async def go() -> list[TenantLimit]:
        await aq.set_tenant_limit("a", "t", max_running=2)
        assert await aq.clear_tenant_limit("a", "t", "report") is False
        return await aq.tenant_limits()

    assert asyncio.run(go()) == [TenantLimit("a", "t", None, max_running=2)]


def test_the_cli_sets_shows_and_clears_limits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Quick.open(url).close()

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    out = invoke("limit", "set", "--store", url, "--app", "a", "--tenant", "t",
                 "--max-running", "2", "--rate", "10", "--per", "1")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "app=a tenant=t max_running=2 rate=10/1s" in out.output
    shown = json.loads(invoke("limit", "show", "--store", url, "--json").output)
    assert shown == [{"app": "a", "tenant": "t", "job_type": None, "max_running": 2,
                      "rate": 10, "per_s": 1.0}]  # fmt: skip
    bad = invoke("limit", "set", "--store", url, "--app", "a", "--tenant", "t",
                 "--max-running", "0")  # fmt: skip
    assert bad.exit_code != 0 and "invalid max_running" in bad.output
    stats = json.loads(invoke("stats", "--store", url, "--json").output)
    assert stats["tenant_limits"] == shown
    cleared = invoke("limit", "clear", "--store", url, "--app", "a", "--tenant", "t")
    assert cleared.exit_code == 0, cleared.output
    assert "no tenant limits" in invoke("limit", "show", "--store", url).output


def test_one_transaction_visits_hold_a_limited_tenant_too(q: Quick, clock: ManualClock) -> None:
    """A one-transaction visit to a limited zone takes the three transactions: the limit
    holds, and the other tenant's zone is visited as before."""
    ran: list[str] = []
    q.job("j")(lambda payload, ctx: ran.append(ctx.tenant))
    q.set_tenant_limit("a", "t", max_running=1, rate=1, per=60.0)
    q.enqueue_many("j", list(range(3)), app="a", tenant="t")
    q.enqueue_many("j", list(range(3)), app="a", tenant="u")
    config = ConsumerConfig(in_order=True, one_transaction_visits=True, visits_per_transaction=4)
    q.consumer(config).run_until_idle()
    assert sorted(ran) == ["t", "u", "u", "u"]


def test_a_tenant_cap_beside_a_job_type_cap_counts_each_run_once(live_q: Quick) -> None:
    """A tenant capped at 3 running, and its "report" items at 3: with one report
    running, two more start beside it. The job type's slot records once lay inside the
    tenant-wide slots' key range, so a running report counted twice against the tenant's
    cap and only one more could start."""
    q = live_q
    release = threading.Event()
    running: list[str] = []
    lock = threading.Lock()

    def handler(payload: Any, ctx: Any) -> None:
        with lock:
            running.append(ctx.item.item_id)
        release.wait(30)

    q.job("report", keep_status_s=600)(handler)
    q.set_tenant_limit("a", "t", max_running=3)
    q.set_tenant_limit("a", "t", job_type="report", max_running=3)
    reports = q.enqueue_many("report", [1], app="a", tenant="t")
    consumer = q.consumer(ConsumerConfig(workers=4, idle_sleep_s=0.01))
    consumer.start()
    try:
        assert wait_for(lambda: len(running) == 1, 15)
        reports += q.enqueue_many("report", [2, 3], app="a", tenant="t")
        all_three = wait_for(lambda: len(running) == 3, 10)
        release.set()
        assert wait_for(lambda: all(_state(q, i) == "completed" for i in reports), 60)
    finally:
        release.set()
        consumer.stop()
    assert all_three, f"{len(running)} of 3 reports ran at once under a tenant cap of 3"

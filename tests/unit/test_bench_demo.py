"""The demo benchmark (issue 40 point 9) itself: it reads the figures of a real ``quick
demo`` process, fails rather than guess when the demo's summary cannot be read, and flags a
tree that does worse than its baseline, while a busy host's misses are no verdict."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench import demo

ROOT = str(Path(__file__).resolve().parents[2])


def test_the_bench_reads_a_real_demo_runs_figures() -> None:
    r = demo.one_run(sys.executable, ["--duration", "1", "--tenants", "2", "--noisy-factor", "4"])

    assert r.run == r.enqueued > 60  # the noisy tenant's backlog alone is 60
    assert 0 <= r.small_p50_ms <= r.small_p99_ms and math.isfinite(r.small_p99_ms)
    assert r.cpu_s > 0


def test_an_unreadable_summary_fails_the_bench() -> None:
    with pytest.raises(demo.DemoOutputUnreadable):
        demo.parse_summary("13565 items run; small tenants fine")
    wrapped = (
        "13565/13565 items run in 20.3s; small tenants overall p50 3.1 ms, p99\n9.6 ms; "
        "worst small-tenant\np99/p50 4.2\n"
    )
    assert demo.parse_summary(wrapped).small_p99_ms == 9.6


def test_runs_with_every_pickup_are_pooled() -> None:
    """A run's p99 is its twentieth slowest small pickup; pooled over the runs, the tail's
    quantiles compare two trees where the runs' p99s only scatter."""
    runs = [
        demo.DemoRun(3, 3, 20.0, 2.0, 9.0, 3.0, small_pickups=(1.0, 2.0, 9.0)),
        demo.DemoRun(4, 4, 20.0, 2.0, 4.0, 2.0, small_pickups=(2.0, 3.0, 4.0, 5.0)),
    ]
    pooled = demo.figures(runs)["pooled_small_ms"]
    assert pooled["pickups"] == 7 and pooled["p50"] == 3.0 and pooled["p99"] == 9.0
    assert "small_pickups" not in demo.figures(runs)["per_run"][0]  # not in the JSON twice
    assert demo.figures([_run(13_565, 9.6)])["pooled_small_ms"] is None  # a demo without them
    r = demo.one_run(sys.executable, ["--duration", "1", "--tenants", "2", "--noisy-factor", "4"])
    one = demo.pooled([r])
    # The printed p99 has one decimal: at most half of it off (9.25 prints 9.2), plus float error.
    assert one is not None and abs(one["p99"] - r.small_p99_ms) <= 0.05 + 1e-9


def _run(items: int, p99: float, load: float = 0.0) -> demo.DemoRun:
    return demo.DemoRun(items, items, 20.0, p99 / 3, p99, 3.0, load_before=load)


def test_check_fails_a_tree_worse_than_its_baseline_and_not_a_busy_host() -> None:
    good = [_run(13_565, 9.6)] * 3
    assert demo.check({"this": good}) == []
    slow = [_run(13_565, 60.0)] * 3
    assert "small tenants' p99 60.0 ms against the baseline's 9.6" in demo.check(
        {"this": slow, "baseline": good}
    )
    assert "8990 items against the baseline's 13565" in demo.check(
        {"this": [_run(8_990, 9.6)] * 3, "baseline": good}
    )
    # A busy host misses the figures whatever the code: only the baseline comparison counts.
    busy = [_run(8_990, 60.0, load=50.0)] * 3
    assert demo.check({"this": busy}) == []
    assert demo.check({"this": busy, "baseline": busy}) == []
    assert demo.check({"this": [_run(13_000, 60.0)] * 3}) == [
        "small tenants' p99 above 10 ms on a quiet host"
    ]


def test_the_pickup_split_covers_every_small_item_and_adds_up() -> None:
    """``bench.demo_pickup`` splits each small tenant's pickup at its visit's dequeue, from
    the consumer's own events: every small item run has both parts, and they add up."""
    from rich.console import Console

    from bench import demo_pickup
    from quickzones.cli.demo import DemoConfig, run_demo

    split = demo_pickup.PickupSplit()
    cfg = DemoConfig(duration_s=1.0, tenants=2, noisy_factor=4)
    assert run_demo(cfg, Console(file=io.StringIO()), split)
    parts = split.parts()
    n = len(parts["enqueue_to_started"])
    assert n > 0 and n == len(split.started)  # no noisy item, every small one dequeued
    assert all(x >= 0 for x in parts["dequeued_to_started"])
    for a, b, whole in zip(*parts.values(), strict=True):
        assert math.isclose(a + b, whole, abs_tol=1e-6)
    r = demo_pickup.one_run(cfg)
    assert r["all_run"] and r["enqueue_to_started"]["n"] > 0


def _sched_policy(pid: int) -> int:
    return os.sched_getscheduler(pid)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_warm_cpus_keeps_every_allowed_cpu_busy_at_idle_priority_and_stops_after() -> None:
    """``--warm-cpus``: a busy loop on each CPU this process may use, at SCHED_IDLE (it
    takes only time nothing else wants), gone once the run ends."""
    allowed = sorted(os.sched_getaffinity(0))
    before = set(psutil.Process().children())
    with demo.cpus_kept_busy() as cpus:
        assert cpus == allowed
        spinners = [p for p in psutil.Process().children() if p not in before]
        assert len(spinners) == len(allowed)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            _sched_policy(p.pid) == os.SCHED_IDLE for p in spinners
        ):
            time.sleep(0.05)
        assert {_sched_policy(p.pid) for p in spinners} == {os.SCHED_IDLE}
        assert sorted(c for p in spinners for c in p.cpu_affinity()) == allowed
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in spinners)


def test_warm_cpus_runs_each_demo_again_beside_this_tree(tmp_path: Path) -> None:
    args = ["--runs", "1", "--warm-cpus", "--out", str(tmp_path), "--"]
    assert demo.main([*args, "--duration", "1", "--tenants", "2", "--noisy-factor", "4"]) == 0
    res = json.loads((tmp_path / "demo.json").read_text())
    assert res["warm_cpus"] is True
    assert set(res["summary"]) == {"this", demo.WARM}
    assert res["summary"][demo.WARM]["items"]["median"] > 60


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_a_bench_killed_outright_leaves_no_busy_loop_behind() -> None:
    """The busy loops end with the process that started them, even one killed with
    SIGKILL (no ``finally`` runs): none is left spinning for good."""
    code = (
        "import sys, time\n"
        "from bench import demo\n"
        "with demo.cpus_kept_busy():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    bench = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert bench.stdout is not None and bench.stdout.readline().strip() == "ready"
        spinners = psutil.Process(bench.pid).children()
        assert len(spinners) == len(os.sched_getaffinity(0))
    finally:
        bench.kill()
        bench.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(map(_spinning, spinners)):
        time.sleep(0.1)
    left = [p.pid for p in spinners if _spinning(p)]
    for pid in left:  # never leave one behind, even when the test fails
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    assert not left, f"busy loops left running: {left}"


def _spinning(proc: psutil.Process) -> bool:
    """Still running: not gone, and not a zombie its new parent has not reaped."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

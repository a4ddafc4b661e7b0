"""A lapsed lease is not a failed attempt (paper section 5): only a handler's failure or a
requeue with an error counts toward ``max_attempts``. ``ctx.attempt``, ``q.status(...)
.attempts`` and a dead letter's attempts are all the runs started, and agree across
nacks, failures and consumer crashes; a poison item that kills its process every time is
dead-lettered after ``RetryPolicy.max_lapses`` lapses of started runs.

On the unchanged code: a lease that lapsed before its handler started counted as a
failure (ctx.attempt 2, attempts 2, error_count 1 for an item that ran once); a nacked
item's next run saw ctx.attempt 1 while its status said 2 attempts; a worker SIGKILLed
mid-handler left error_count 1; the poison item took 10 crashed processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import Nack
from quickzones.registry import JobContext, RetryPolicy
from tests.waiting import wait_for

KEEP = 3600.0


def test_a_lease_that_lapsed_before_its_handler_started_is_no_attempt(
    q: Quick, clock: ManualClock
) -> None:
    seen: list[int] = []
    q.job("job", keep_status_s=KEEP)(lambda payload, ctx: seen.append(ctx.attempt))
    item_id = q.enqueue("job", b"", app="a", tenant="t")
    died = q.consumer(ConsumerConfig(in_order=True, item_lease_s=5))
    [ref] = died.scan_once()
    assert len(died.visit(ref)) == 1  # leased; its consumer dies before a worker starts it
    clock.advance(6)
    assert q.run_until_idle(ConsumerConfig(in_order=True)) == 1
    status = q.status("a", "t", item_id)
    assert status is not None
    assert seen == [1]
    assert (status.state, status.attempts, status.error_count) == ("completed", 1, 0)


def test_attempts_agree_across_a_nack_and_failures(q: Quick, clock: ManualClock) -> None:
    seen: list[int] = []

    @q.job("job", retry=RetryPolicy(max_attempts=2, backoff_base_s=1, jitter=False))
    def job(payload: Any, ctx: JobContext) -> None:
        seen.append(ctx.attempt)
        if len(seen) == 1:
            raise Nack(0)
        raise RuntimeError("broken")

    item_id = q.enqueue("job", b"", app="a", tenant="t")
    config = ConsumerConfig(in_order=True)
    for _ in range(5):
        q.run_until_idle(config)
        clock.advance(5)
    [letter] = q.dead_letters("a")
    status = q.status("a", "t", item_id)
    assert status is not None and letter.item is not None
    assert seen == [1, 2, 3]
    assert (status.state, status.attempts, status.error_count) == ("dead_lettered", 3, 2)
    assert (letter.item.attempts, letter.item.error_count) == (3, 2)


KILLED = textwrap.dedent(
    """
    import os, pathlib, signal, time
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_TEST_URL"])
    marker = pathlib.Path(os.environ["QUICK_TEST_MARKER"])

    @q.job("job", keep_status_s=3600)
    def job(payload, ctx):
        # One temporary file per item: several workers renaming one shared name could
        # move another's file in just after its open truncated it (an empty marker).
        tmp = marker.with_name(f"{marker.name}.{ctx.item_id}.tmp")
        tmp.write_text(str(ctx.attempt))
        tmp.rename(marker)
        if payload == "poison":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)
    """
)


def _worker(tmp_path: Path, url: str) -> subprocess.Popen[bytes]:
    (tmp_path / "killed_app.py").write_text(KILLED)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
        "QUICK_TEST_URL": url,
        "QUICK_TEST_MARKER": str(tmp_path / "started"),
    }
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "killed_app:q"]
    return subprocess.Popen(
        [*cmd, "--workers", "1", "--lease", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_a_worker_killed_mid_handler_costs_no_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    marker = tmp_path / "started"
    q = Quick.open(url)
    seen: list[int] = []

    @q.job("job", keep_status_s=KEEP)
    def job(payload: Any, ctx: JobContext) -> None:
        seen.append(ctx.attempt)

    item_id = q.enqueue("job", "slow", app="a", tenant="t")
    proc = _worker(tmp_path, url)
    try:
        assert wait_for(marker.exists, timeout=60), "the worker never started the item"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == "1"
    time.sleep(1.2)  # the killed worker's lease runs out
    assert wait_for(lambda: q.run_until_idle(ConsumerConfig(in_order=True)) == 1 or seen)
    status = q.status("a", "t", item_id)
    q.close()
    assert status is not None
    # The killed run is a lapse, not an attempt: the next run is attempt 1 again.
    assert seen == [1]
    assert (status.state, status.attempts, status.error_count) == ("completed", 1, 0)


def test_an_item_that_kills_its_process_every_time_is_dead_lettered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(url)
    q.job("job", keep_status_s=KEEP)(lambda payload, ctx: None)  # never run here
    item_id = q.enqueue("job", "poison", app="a", tenant="t")
    launches = 0
    while not q.dead_letters("a") and launches < 6:
        launches += 1
        proc = _worker(tmp_path, url)
        try:
            wait_for(lambda p=proc: p.poll() is not None or bool(q.dead_letters("a")), timeout=60)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    letters = q.dead_letters("a")
    status = q.status("a", "t", item_id)
    q.close()
    assert [letter.item_id for letter in letters] == [item_id], f"{launches} processes died"
    assert "lapsed 3 times, never released" in letters[0].reason
    # The three runs that crashed are lapses, not attempts (no handler failed).
    assert status is not None and status.attempts == 1

"""Exact timers in a real consumer process (issue 15 point 5): an at-most-once item
the worker leased ahead of its vesting time and holds for its timer is put back, due at
the same time, when the worker stops (SIGTERM), neither lost nor vested early; another
worker then runs it at its time."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

from integration.cli.workers import start_consumer, stop_worker
from quickzones.client import Quick

HANDLERS = textwrap.dedent(
    """
    import os, time
    from quickzones.client import Quick

    quick = Quick.open(os.environ["QUICK_STORE"])
    fd = os.open(os.environ["QUICK_RAN_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    @quick.job("timed", delivery="at_most_once")
    def timed(payload, ctx):
        os.write(fd, f"{ctx.item_id} {quick.clock.now() * 1000}\\n".encode())
    """
)


def _start_worker(tmp_path: Path, store: str, lookahead: float) -> subprocess.Popen[bytes]:
    # timer_lookahead_s is a ConsumerConfig field set from Python (no quick worker option).
    return start_consumer(tmp_path, store, "timer_handlers", HANDLERS, timer_lookahead_s=lookahead)


def _ran(tmp_path: Path) -> dict[str, float]:
    log = tmp_path / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return {item_id: float(at) for item_id, at in (line.split() for line in lines)}


def test_sigterm_puts_back_an_item_held_for_its_timer_due_as_before(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'timers.db'}"
    q = Quick.open(store)
    try:
        item_id = q.enqueue("timed", {}, app="app", tenant="t1", delay=8.0)
        status = q.status("app", "t1", item_id)
        assert status is not None and status.next_vesting_ms is not None
        due = status.next_vesting_ms
        # A lookahead longer than the delay: the worker leases it at once and holds it.
        proc = _start_worker(tmp_path, store, 10)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                status = q.status("app", "t1", item_id)
                if status is not None and status.state == "leased":
                    break
                time.sleep(0.05)
            assert status is not None and status.state == "leased", status
        finally:
            err = stop_worker(proc)
        assert proc.returncode in (0, -signal.SIGTERM), err.decode()
        assert _ran(tmp_path) == {}
        back = q.status("app", "t1", item_id)
        assert back is not None and back.state == "queued", back
        assert back.next_vesting_ms == due and back.error_count == 0

        proc = _start_worker(tmp_path, store, 0.05)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and item_id not in _ran(tmp_path):
                time.sleep(0.05)
        finally:
            stop_worker(proc)
        assert _ran(tmp_path)[item_id] >= due  # at its time, not before
    finally:
        q.close()

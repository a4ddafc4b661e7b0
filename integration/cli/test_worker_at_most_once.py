"""At-most-once items in a real ``quick worker`` process: an item is deleted only when its
handler really starts, so items taken but not started are put back, not lost, when the
worker stops (SIGTERM) or when a pool-wide concurrency cap refuses them (issue 12.1)."""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

from integration.cli.workers import start_worker, stop_worker
from quickzones.client import Quick

HANDLERS = textwrap.dedent(
    """
    import os, time
    from quickzones.client import Quick

    quick = Quick.open(os.environ["QUICK_STORE"])
    fd = os.open(os.environ["QUICK_RAN_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    @quick.job("block", delivery="at_most_once")
    def block(payload, ctx):
        os.write(fd, (ctx.item_id + "\\n").encode())
        end = time.monotonic() + 600
        while time.monotonic() < end:  # blocks until the shutdown interrupt
            time.sleep(0.05)

    @quick.job("capped", delivery="at_most_once", pool_max_concurrency=1)
    def capped(payload, ctx):
        os.write(fd, (ctx.item_id + "\\n").encode())
        time.sleep(0.2)
    """
)


def _start_worker(tmp_path: Path, store: str) -> subprocess.Popen[bytes]:
    return start_worker(tmp_path, store, "amo_handlers", HANDLERS)


def _ran(tmp_path: Path) -> set[str]:
    log = tmp_path / "ran.log"
    return set(log.read_text().split()) if log.exists() else set()


def test_sigterm_puts_back_at_most_once_items_not_started(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'amo.db'}"
    q = Quick.open(store)
    ids = [q.enqueue("block", {"i": i}, app="app", tenant="t1") for i in range(20)]
    proc = _start_worker(tmp_path, store)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(_ran(tmp_path)) < 8:  # 8 workers busy
            time.sleep(0.1)
        assert len(_ran(tmp_path)) == 8
        time.sleep(1.0)  # the managers take the other 12 into the local queue
    finally:
        stop_worker(proc)
    ran = _ran(tmp_path)
    queued = {i for i in ids if q.get("app", "t1", i) is not None}
    lost = set(ids) - ran - queued
    print(f"SIGTERM: lost {len(lost)} of {len(ids)} (ran {len(ran)}, queued {len(queued)})")
    assert not lost
    assert not ran & queued  # at most once: a started item is gone
    # Given back, not left leased until the lease expires: visible at once.
    assert all(q.get("app", "t1", i).lease_id is None for i in queued)  # type: ignore[union-attr]


def test_pool_cap_refusal_puts_back_at_most_once_items(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'amo.db'}"
    q = Quick.open(store)
    ids = [q.enqueue("capped", {"i": i}, app="app", tenant="t1") for i in range(10)]
    proc = _start_worker(tmp_path, store)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            if all(q.get("app", "t1", i) is None for i in ids):
                break  # every item started (or was lost)
            time.sleep(0.2)
        time.sleep(1.0)  # the last started handlers write their log line
    finally:
        stop_worker(proc)
    ran = _ran(tmp_path)
    queued = {i for i in ids if q.get("app", "t1", i) is not None}
    lost = set(ids) - ran - queued
    print(f"pool cap: lost {len(lost)} of {len(ids)} (ran {len(ran)}, queued {len(queued)})")
    assert not lost
    assert ran == set(ids)

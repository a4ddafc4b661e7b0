"""A worker process killed with SIGKILL mid-item on SQLite: after the lease expires another
worker completes the item, and nothing is lost (invariant 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.waiting import wait_for

WORKER = textwrap.dedent(
    """
    import sys, time, pathlib
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    q = Quick.open(sys.argv[1])
    marker = pathlib.Path(sys.argv[2])

    @q.job("job")
    def job(payload, ctx):
        # One temporary file per item: several workers renaming one shared name could
        # move another's file in just after its open truncated it (an empty marker).
        tmp = marker.with_name(f"{marker.name}.{ctx.item_id}.tmp")
        tmp.write_text(ctx.item_id)
        tmp.rename(marker)  # atomic: the test never reads a half-written marker
        time.sleep(3600)

    q.consumer(ConsumerConfig(item_lease_s=1.0, idle_sleep_s=0.01)).run_forever()
    """
)


def test_item_of_killed_worker_runs_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    marker = tmp_path / "started"
    producer = Quick.open(url)
    item_ids = {producer.enqueue("job", {"n": i}, app="app", tenant="t") for i in range(5)}
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url, str(marker)], env=env)
    try:
        # A fresh interpreter importing quick on a loaded host: 4 s at load 10.
        assert wait_for(marker.exists), "the worker never started an item"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_item = marker.read_text()

    done: list[str] = []
    lock = threading.Lock()

    @producer.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        with lock:
            done.append(ctx.item_id)

    consumer = producer.consumer(ConsumerConfig(idle_sleep_s=0.01))
    consumer.start()
    try:
        wait_for(lambda: set(done) == item_ids)
    finally:
        consumer.stop()
    assert set(done) == item_ids
    assert killed_item in done
    assert producer.zones.count(producer.zone("app", "t")) == 0
    producer.close()


def test_sigterm_gives_back_leases_and_exits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    marker = tmp_path / "started"
    producer = Quick.open(url)
    item_id = producer.enqueue("job", b"", app="app", tenant="t")
    script = WORKER.replace(
        "ConsumerConfig(item_lease_s=1.0, idle_sleep_s=0.01)",
        "ConsumerConfig(item_lease_s=60.0, idle_sleep_s=0.01, shutdown_deadline_s=0.5)",
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", script, url, str(marker)], env=env)
    try:
        assert wait_for(marker.exists)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    item = producer.get("app", "t", item_id)
    # The 60 s lease was given back at shutdown: the item is vested again at once.
    assert item is not None and item.lease_id is None and item.error_count == 0
    assert producer.zones.peek(producer.zone("app", "t"), 1)
    producer.close()

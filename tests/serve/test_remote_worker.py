"""Handlers run on a remote worker through the pull API: completion, retry with backoff,
Nack, permanent failure with its traceback; and ``quick worker --remote`` as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from quickzones.errors import Nack, PermanentError
from quickzones.registry import RetryPolicy
from quickzones.store.admin import zone_count

from .conftest import CountingTransport, Served


def test_remote_worker_runs_handlers_and_reports_outcomes(served: Served) -> None:
    handlers = Quick.open("memory://")  # only its registry is used: the store is remote
    ran: list[Any] = []
    tries: dict[str, int] = {}

    @handlers.job("ok")
    def ok(payload: Any, ctx: Any) -> None:
        ran.append((ctx.tenant, payload))

    @handlers.job("flaky", retry=RetryPolicy(backoff_base_s=0.01, backoff_cap_s=0.05))
    def flaky(payload: Any, ctx: Any) -> None:
        tries[ctx.item_id] = tries.get(ctx.item_id, 0) + 1
        if tries[ctx.item_id] < 3:
            raise RuntimeError("not yet")
        ran.append(("flaky", payload))

    @handlers.job("nacked")
    def nacked(payload: Any, ctx: Any) -> None:
        if ctx.item.attempts < 2:
            raise Nack(0.0)
        ran.append(("nacked", payload))

    @handlers.job("broken")
    def broken(payload: Any, ctx: Any) -> None:
        raise PermanentError("cannot ever work")

    q = served.q
    q.enqueue("ok", {"n": 1}, app="a", tenant="t1")
    q.enqueue("ok", b"raw", app="a", tenant="t2")
    q.enqueue("flaky", 7, app="a", tenant="t1")
    q.enqueue("nacked", 8, app="a", tenant="t3")
    q.enqueue("broken", 9, app="a", tenant="t3", item_id="bad")
    q.enqueue("ok", 1, app="b", tenant="t")  # another app: not this worker's
    try:
        with RemoteQuick(served.url, served.a_all) as client:
            worker = RemoteWorker(handlers.registry, client, workers=4, lease_s=10)
            deadline = time.monotonic() + 30
            while len(ran) < 4 and time.monotonic() < deadline:
                worker._stop.clear()
                worker.run_forever(idle_exit=True)
                time.sleep(0.05)
            worker.close()
    finally:
        handlers.close()
    assert sorted(map(str, ran)) == sorted(
        map(str, [("t1", {"n": 1}), ("t2", b"raw"), ("flaky", 7), ("nacked", 8)])
    )
    assert worker.stats.retried == 2 and worker.stats.failed == 1
    [letter] = q.dead_letters("a")
    assert letter.item_id == "bad" and "cannot ever work" in (letter.traceback or "")
    assert zone_count(q, q.zone("b", "t")) == 1  # another app's item was left alone


def test_quick_worker_remote_process(served: Served, tmp_path: Path) -> None:
    out = tmp_path / "ran.txt"
    (tmp_path / "remote_handlers.py").write_text(
        "from quickzones import Quick\n"
        "quick = Quick.open('memory://')\n"
        "@quick.job('write')\n"
        "def write(payload, ctx):\n"
        f"    with open({str(out)!r}, 'a') as f:\n"
        "        f.write(f'{ctx.tenant}:{payload}\\n')\n"
    )
    for n in range(5):
        served.q.enqueue("write", n, app="a", tenant=f"t{n}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quickzones",
            "worker",
            "--app-module",
            "remote_handlers",
            "--remote",
            served.url,
            "--workers",
            "2",
        ],
        cwd=tmp_path,
        env={**os.environ, "QUICK_TOKEN": served.a_all},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_text().splitlines()) >= 5:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "job types write" in stdout
    assert sorted(out.read_text().splitlines()) == [f"t{n}:{n}" for n in range(5)]
    assert served.q.run_until_idle() == 0


def test_remote_worker_completes_finished_items_together(served: Served) -> None:
    """Items whose handlers finish within complete_linger_s of each other are completed
    by one POST /v1/completions, not one request each."""
    handlers = Quick.open("memory://")
    ran: list[int] = []

    @handlers.job("ok")
    def ok(payload: Any, ctx: Any) -> None:
        ran.append(payload)

    served.q.enqueue_many("ok", list(range(5)), app="a", tenant="t")
    transport = CountingTransport()
    try:
        with RemoteQuick(served.url, served.a_all, transport=transport) as client:
            worker = RemoteWorker(
                handlers.registry, client, workers=5, lease_s=30, complete_linger_s=30
            )
            worker.run_forever(idle_exit=True)
            worker.close()
    finally:
        handlers.close()
    assert sorted(ran) == [0, 1, 2, 3, 4] and worker.stats.completed == 5
    assert transport.paths.count("/v1/completions") == 1
    assert not any(p.endswith("/complete") for p in transport.paths)
    assert served.q.run_until_idle() == 0

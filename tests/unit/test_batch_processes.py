"""A batch run by two consumer processes (issue 31, point 5): 100 items over 10 tenants,
the callback runs exactly once after all of them, also when one process is killed with
SIGKILL in the middle of the batch. On the stores several processes share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quickzones import Job
from quickzones.client import Quick
from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url

SHARED = [
    "sqlite",
    *([pytest.param("fdb", marks=[pytest.mark.fdb])] if HAVE_FDB else []),
    *(["postgres"] if HAVE_POSTGRES else []),
]

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    q = Quick.open(sys.argv[1])
    calls = sys.argv[2]

    @q.job("item")
    def item(payload, ctx):
        time.sleep(0.05)

    @q.job("done")
    def done(payload, ctx):
        fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (ctx.item_id + " %d\\n" % payload["completed"]).encode())
        os.close(fd)

    q.consumer(ConsumerConfig(item_lease_s=1.0, idle_sleep_s=0.01)).run_forever()
    """
)


def _wait(what: str, ok: object, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _run_batch(backend: str, tmp_path: Path, *, kill_one: bool) -> None:
    url = store_url(backend, tmp_path)
    calls = tmp_path / "callbacks"
    q = Quick.open(url)
    batch = q.enqueue_batch(
        [Job("item", {"n": n}, tenant=f"t{n % 10}") for n in range(100)],
        app="app",
        callback=Job("done", None, tenant="t0"),
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, url, str(calls)], env=env) for _ in range(2)
    ]
    try:
        if kill_one:

            def midway() -> bool:
                status = q.batch_status("app", batch.id)
                return status is not None and status.completed >= 20

            _wait("20 items completed", midway)
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
        _wait("the callback", lambda: calls.exists() and calls.read_text().endswith("\n"))

        def settled() -> bool:
            status = q.batch_status("app", batch.id)
            gone = q.get("app", "t0", batch.callback_id) is None
            return status is not None and status.pending == 0 and gone

        _wait("the callback to finish", settled)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    lines = calls.read_text().splitlines()
    assert lines == [f"{batch.callback_id} 100"]
    status = q.batch_status("app", batch.id)
    assert status is not None and (status.completed, status.dead_lettered) == (100, 0)
    q.close()


@pytest.mark.parametrize("backend", SHARED)
def test_two_processes_run_a_batch_and_its_callback_once(backend: str, tmp_path: Path) -> None:
    _run_batch(backend, tmp_path, kill_one=False)


@pytest.mark.parametrize("backend", SHARED)
def test_a_consumer_killed_mid_batch_still_gives_one_callback(backend: str, tmp_path: Path) -> None:
    _run_batch(backend, tmp_path, kill_one=True)

"""``quick worker --metrics-port`` end to end: a real worker process serves Prometheus
metrics that this test scrapes after the worker ran some items."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from quickzones.client import Quick
from quickzones.testing.provision import free_port

HANDLERS = textwrap.dedent(
    """
    import os
    from quickzones.client import Quick

    quick = Quick.open(os.environ["QUICK_STORE"])

    @quick.job("noop")
    def noop(payload, ctx):
        pass
    """
)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        return resp.read().decode()


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{want}}} not in metrics")


def test_worker_serves_metrics(tmp_path: Path) -> None:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    store = f"sqlite:///{tmp_path / 'm.db'}"
    q = Quick.open(store)
    for i in range(20):
        q.enqueue("noop", {"i": i}, app="shop", tenant=f"t{i % 4}")
    q.enqueue("noop", b"", app="later", tenant="t", delay=3600)
    port = free_port()
    env = {**os.environ, "QUICK_STORE": store, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quickzones",
            "worker",
            "--app-module",
            "handlers",
            "--metrics-port",
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        text = ""
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                text = scrape(port)
                if metric(text, "quick_events_total", event="completed", app="shop") >= 20:
                    break
            except (OSError, AssertionError):
                pass
            time.sleep(0.2)
        assert metric(text, "quick_events_total", event="completed", app="shop") == 20
        assert metric(text, "quick_events_total", event="dequeued", app="shop") == 20
        assert metric(text, "quick_pickup_seconds_count", app="shop") == 20
        assert metric(text, "quick_queue_depth", app="later") == 1
        assert metric(text, "quick_pointers", shard="0") >= 1
        assert "quick_pointer_lease_failures_total" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()

"""Restarting ``quick serve`` under ``quick worker --remote`` (issue 28 point 13): the
worker keeps running, retries with backoff, says once that the server is unreachable and
once that it is back, with no traceback, and runs what is enqueued after the restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from tests.waiting import wait_for

from .conftest import ServerThread

HANDLERS = """\
import os
from quickzones import Quick
quick = Quick.open("memory://")
@quick.job("note")
def note(payload, ctx):
    with open(os.environ["RAN"], "a") as f:
        f.write(f"{payload}\\n")
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_quick_worker_remote_survives_a_server_restart(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'quick.db'}")
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["produce", "consume"])[0]
    config = ConsumerConfig(min_inactive_s=0.5)
    ran = tmp_path / "ran.txt"
    (tmp_path / "handlers.py").write_text(HANDLERS)
    errors = tmp_path / "worker.err"
    server = ServerThread(create_app(q, config=config)).__enter__()
    port = server.port
    with open(errors, "w") as err_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quickzones",
                "worker",
                "--app-module",
                "handlers",
                "--remote",
                server.url,
                "--workers",
                "2",
            ],
            cwd=tmp_path,
            env={**os.environ, "QUICK_TOKEN": token, "RAN": str(ran)},
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        for n in range(5):
            q.enqueue("note", f"before-{n}", app="a", tenant=f"t{n}")
        assert wait_for(lambda: len(_lines(ran)) == 5), errors.read_text()
        server.__exit__()  # quick serve goes away ...
        time.sleep(3)  # ... long enough for several failed leases
        assert proc.poll() is None, errors.read_text()
        server = ServerThread(create_app(q, config=config), port=port).__enter__()  # ... back
        for n in range(5):
            q.enqueue("note", f"after-{n}", app="a", tenant=f"t{n}")
        assert wait_for(lambda: len(_lines(ran)) == 10), errors.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        server.__exit__()
        q.close()
    log = errors.read_text()
    # Before: the worker ended at the restart with an httpx.ConnectError traceback.
    assert proc.returncode == 0, log
    assert "Traceback" not in log, log
    assert log.count("is unreachable") == 1 and log.count("is reachable again") == 1, log
    assert sorted(_lines(ran)) == sorted(
        [f"before-{n}" for n in range(5)] + [f"after-{n}" for n in range(5)]
    )

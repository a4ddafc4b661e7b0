"""A running item cancelled under ``quick worker --remote`` (issue 27 point 1.6): its
handler sees ``ctx.cancelled`` within a second or so, not at the next lease extension
(a third of ``--lease``), through one request a check for all the worker's running
items (``POST /v1/leases/cancelled``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from quickzones.adapters.http.client import RemoteQuick
from tests.waiting import wait_for

from .conftest import Served

HANDLERS = """\
import os, time
from quickzones import Quick
quick = Quick.open("memory://")
@quick.job("long")
def long(payload, ctx):
    notes = os.environ["NOTES"]
    with open(notes, "a") as f:
        f.write(f"started {payload}\\n")
    until = time.monotonic() + 60
    while not ctx.cancelled and time.monotonic() < until:
        time.sleep(0.02)
    with open(notes, "a") as f:
        f.write(f"{'cancelled' if ctx.cancelled else 'ran out'} {payload}\\n")
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_quick_worker_remote_handler_sees_a_cancel_soon(served: Served, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    (tmp_path / "handlers.py").write_text(HANDLERS)
    for n in range(3):
        served.q.enqueue("long", n, app="a", tenant=f"t{n}", item_id=f"item-{n}")
    errors = tmp_path / "worker.err"
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
                served.url,
                "--workers",
                "3",
                "--lease",
                "90",
            ],
            cwd=tmp_path,
            env={**os.environ, "QUICK_TOKEN": served.a_all, "NOTES": str(notes)},
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        assert wait_for(lambda: len(_lines(notes)) == 3), errors.read_text()
        with RemoteQuick(served.url, served.a_all) as client:
            client.cancel("a", "t1", "item-1")  # through the API, as a producer would
        # Before: seen at the next extension, 30 s in with --lease 90 (none within 10 s).
        assert wait_for(lambda: "cancelled 1" in _lines(notes), 10), _lines(notes)
        assert not any(line.startswith("cancelled 0") for line in _lines(notes))
        for n in (0, 2):
            served.q.cancel("a", f"t{n}", f"item-{n}")
        assert wait_for(lambda: len(_lines(notes)) == 6, 10), _lines(notes)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert sorted(_lines(notes)[3:]) == [f"cancelled {n}" for n in range(3)]
    assert proc.returncode == 0, errors.read_text()
    assert served.q.run_until_idle() == 0  # cancelled: nothing left to run


def test_the_cancelled_route_answers_for_every_lease_in_one_request(served: Served) -> None:
    for n in range(3):
        served.q.enqueue("long", n, app="a", tenant="t", item_id=f"item-{n}")
    with RemoteQuick(served.url, served.a_all) as client:
        leases = client.lease(3, lease_s=30)
        assert len(leases) == 3
        served.q.cancel("a", "t", leases[1].item_id)
        assert client.cancelled(leases) == [False, True, False]
        other = httpx.post(
            f"{served.url}/v1/leases/cancelled",
            json={"items": [{"app": "a", "tenant": "t", "item_id": "x", "lease_id": "y"}]},
            headers={"Authorization": f"Bearer {served.b_all}"},
        )
        assert other.status_code == 403, other.text  # another app's token

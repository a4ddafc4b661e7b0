"""Issue 28, point 4: clients that send half their headers and stop (slowloris) are
timed out, and connections are capped below the open-file limit, so they cannot starve
the server of file descriptors: health and enqueue keep answering."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from quickzones.client import Quick
from tests.waiting import wait_for

from .conftest import serve_process

HALF_SENT = b"POST /v1/leases HTTP/1.1\r\nHost: quick\r\nContent-Type: application/json\r\n"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _answers(url: str, path: str = "/v1/health", **kwargs: object) -> httpx.Response | None:
    try:
        return httpx.get(url + path, timeout=5, **kwargs)  # type: ignore[arg-type]
    except httpx.HTTPError:
        return None


def test_300_half_open_connections_are_timed_out_and_health_answers(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(store).close()
    made = subprocess.run(
        [sys.executable, "-m", "quickzones", "tokens", "create", "--app", "a", "--role",
         "produce", "--json", "--store", store],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    token = json.loads(made.stdout)["token"]
    with serve_process(store, open_files=256) as (url, proc):
        before = _fds(proc.pid)
        port = int(url.rsplit(":", 1)[1])
        attackers = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(HALF_SENT)  # and never the blank line that ends the headers
                attackers.append(s)
            # While the attacker's 300 sockets are open on its side, health answers...
            health = None

            def health_answers() -> bool:
                nonlocal health
                health = _answers(url)
                return health is not None and health.status_code == 200

            assert wait_for(health_answers, timeout=60), "health never answered"
            # ...and so does an enqueue,
            r = httpx.post(url + "/v1/apps/a/tenants/t/items", json={"job_type": "j"},
                           headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
            assert r.status_code == 201, r.text
            # and the server's descriptors drop back: it closed the half-open connections.
            assert wait_for(lambda: _fds(proc.pid) <= before + 10, timeout=60), (
                f"{_fds(proc.pid)} descriptors open, {before} before the attack"
            )
        finally:
            for s in attackers:
                s.close()

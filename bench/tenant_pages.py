"""`quick serve`'s pages over one store, timed: each page requested ``requests`` times in
turn (the first of each is its first load, a cold cache), p50 and p99 per page, and the
server process's resident memory before the first request and after the last.

Part of ``bench.tenant_scale`` (issue 43 point 4): app ``a`` is the big store's app of
many tenants, dead letters and settings; ``b`` the app of the other cases' work.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import REPO, child_env, latency_summary
from quickzones.adapters.http.tokens import TokenStore
from quickzones.client import Quick
from quickzones.testing.provision.ports import free_port

# Dashboard pages (a session cookie) and API pages (a bearer token), of app a and overall.
DASHBOARD = [
    "/",
    "/overview.json",
    "/apps/a",
    "/apps/a?search=t00099",
    "/apps/a/tenants/t0000001",
    "/apps/a/dead-letters",
    "/apps/a/fairness",
    "/workers",
    "/shards",
]
API = [
    "/v1/apps/a/stats",
    "/v1/apps/a/zones",
    "/v1/apps/a/dead-letters",
    "/v1/apps/a/dead-letters?tenant=t0000001",
    "/v1/apps/a/pauses",
    "/v1/apps/a/weights",
    "/v1/apps/a/tenant-limits",
    "/v1/apps/b/zones",
    "/v1/shards",
]


def rss_mb(pid: int) -> float:
    """A process's resident memory (Linux /proc), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _token(url: str) -> str:
    q = Quick.open(url)
    try:
        return TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
    finally:
        q.close()


def _serve(url: str, logf: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "quickzones", "serve", "--store", url, "--port", str(port)]
    with open(logf, "ab") as out:
        proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"], cwd=REPO, env=child_env(), stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/v1/health").status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"quick serve did not start: see {logf}")


def measure(url: str, requests: int, logf: Path, budget_s: float = 60.0) -> dict[str, Any]:
    """Every page of DASHBOARD and API ``requests`` times over ``quick serve`` on ``url``,
    in turn; a page whose requests have taken ``budget_s`` in all (or one of which timed
    out) is requested no more: its ``n`` says how many were made, ``cut`` that it was cut."""
    token = _token(url)
    proc, base = _serve(url, logf)
    timeout = httpx.Timeout(budget_s)
    try:
        board = httpx.Client(base_url=base, timeout=timeout)
        board.post("/login", data={"token": token})
        bearer = {"Authorization": f"Bearer {token}"}
        api = httpx.Client(base_url=base, timeout=timeout, headers=bearer)
        rss_before = rss_mb(proc.pid)
        times: dict[str, list[float]] = {p: [] for p in DASHBOARD + API}
        cut: set[str] = set()
        for _ in range(requests):
            for client, paths in ((board, DASHBOARD), (api, API)):
                for page in paths:
                    if page in cut:
                        continue
                    t0 = time.perf_counter()
                    try:
                        status = client.get(page).status_code
                    except httpx.TimeoutException:
                        status = 0
                    times[page].append((time.perf_counter() - t0) * 1000)
                    if status not in (0, 200):
                        raise RuntimeError(f"{page}: HTTP {status} (see {logf})")
                    if status == 0 or sum(times[page]) > budget_s * 1000:
                        cut.add(page)
        rss_after = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)
    pages = {p: {**latency_summary(ms), "first": ms[0], "cut": p in cut} for p, ms in times.items()}
    return {
        "pages": pages,
        "rss_before_mb": round(rss_before, 1),
        "rss_after_mb": round(rss_after, 1),
        "rss_growth_mb": round(rss_after - rss_before, 1),
        "worst_p99_ms": max(v["p99"] for v in pages.values()),
        "budget_s": budget_s,
    }

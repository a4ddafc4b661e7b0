"""Dashboard response times over 100,000 non-empty zones (one item each) on sqlite: the
first load of each page (a scan) and later loads (served from the stale-while-revalidate
cache while a background thread rescans).

    python -m bench.serve_dashboard_scale [--zones 100000]

``--fairness`` measures the fairness view instead (issue 43 point 3): each of its pages
loaded ``--repeat`` times, p50 and p99 in ms and bytes, and the process's RSS growth
from before the first page to after the last (the server runs in this process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.store.kv import KVTransaction
from tests.serve.conftest import ServerThread

PAGES = ["/overview.json", "/", "/apps/big", "/apps/big?offset=90000",
         "/apps/big?search=tenant-0999", "/apps/big/tenants/tenant-000001",
         "/apps/big/dead-letters", "/shards"]  # fmt: skip
FAIRNESS = ["/apps/big/fairness", "/apps/big/fairness?section=waiting",
            "/apps/big/fairness?search=tenant-0999", "/apps/big/fairness.json"]  # fmt: skip


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _fill(q: Quick, zones: int) -> None:
    for start in range(0, zones, 2000):

        def fill(tr: KVTransaction, start: int = start) -> None:
            for i in range(start, min(zones, start + 2000)):
                q.enqueue("job", i, app="big", tenant=f"tenant-{i:06d}", tr=tr)

        q.transact(fill)


def _fairness(client: httpx.Client, repeat: int) -> dict[str, object]:
    out: dict[str, object] = {}
    rss_before = _rss_mb()
    for page in FAIRNESS:
        times, sizes, status = [], [], 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            r = client.get(page)
            times.append((time.perf_counter() - t0) * 1000)
            sizes.append(len(r.content))
            status = r.status_code
        times.sort()
        out[page] = {
            "status": status,
            "first_ms": round(times[0] if repeat == 1 else times[-1]),
            "p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 1),
            "bytes": max(sizes),
        }
        print(page, out[page], f"rss {_rss_mb():.0f} MB", file=sys.stderr, flush=True)
    first = client.get(FAIRNESS[-1])
    if first.status_code == 200:  # the live refresh's poll when nothing changed: 304
        polls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            r = client.get(FAIRNESS[-1], params={"since": first.json()["version"]})
            polls.append((time.perf_counter() - t0) * 1000)
        polls.sort()
        out["poll_unchanged"] = {
            "status": r.status_code,
            "p50_ms": round(statistics.median(polls), 1),
            "p99_ms": round(polls[min(len(polls) - 1, int(0.99 * len(polls)))], 1),
            "bytes": len(r.content),
        }
    out["rss_growth_mb"] = round(_rss_mb() - rss_before, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zones", type=int, default=100_000)
    ap.add_argument("--fairness", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--db", help="reuse (or create) this sqlite file instead of a temporary one")
    args = ap.parse_args()
    out: dict[str, object] = {"zones": args.zones}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.db) if args.db else Path(tmp) / "big.db"
        fresh = not path.exists()
        q = Quick.open(f"sqlite:///{path}")
        started = time.monotonic()
        if fresh:
            _fill(q, args.zones)
        out["fill_s"] = round(time.monotonic() - started, 1)
        token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
        with ServerThread(create_app(q)) as server:
            client = httpx.Client(base_url=server.url, timeout=600)
            client.post("/login", data={"token": token})
            if args.fairness:
                out["fairness"] = _fairness(client, args.repeat)
            else:
                for phase in ("first_ms", "again_ms"):
                    times: dict[str, int] = {}
                    for page in PAGES:
                        t0 = time.perf_counter()
                        assert client.get(page).status_code == 200, page
                        times[page] = round((time.perf_counter() - t0) * 1000)
                    out[phase] = times
                time.sleep(5)  # every cached value is stale now: served stale, refreshed
                t0 = time.perf_counter()
                client.get("/overview.json")
                out["stale_overview_ms"] = round((time.perf_counter() - t0) * 1000)
        q.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

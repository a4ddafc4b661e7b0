"""Dashboard response times over 100,000 non-empty zones (one item each) on sqlite: the
first load of each page (a scan) and later loads (served from the stale-while-revalidate
cache while a background thread rescans).

    python -m bench.serve_dashboard_scale [--zones 100000]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zones", type=int, default=100_000)
    args = ap.parse_args()
    out: dict[str, object] = {"zones": args.zones}
    with tempfile.TemporaryDirectory() as tmp:
        q = Quick.open(f"sqlite:///{Path(tmp) / 'big.db'}")
        started = time.monotonic()
        for start in range(0, args.zones, 2000):

            def fill(tr: KVTransaction, start: int = start) -> None:
                for i in range(start, min(args.zones, start + 2000)):
                    q.enqueue("job", i, app="big", tenant=f"tenant-{i:06d}", tr=tr)

            q.transact(fill)
        out["fill_s"] = round(time.monotonic() - started, 1)
        token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
        with ServerThread(create_app(q)) as server:
            client = httpx.Client(base_url=server.url, timeout=120)
            client.post("/login", data={"token": token})
            for phase in ("first_ms", "again_ms"):
                times: dict[str, int] = {}
                for page in PAGES:
                    t0 = time.perf_counter()
                    assert client.get(page).status_code == 200, page
                    times[page] = round((time.perf_counter() - t0) * 1000)
                out[phase] = times
            time.sleep(5)  # every cached value is stale now: served stale, refreshed behind
            t0 = time.perf_counter()
            client.get("/overview.json")
            out["stale_overview_ms"] = round((time.perf_counter() - t0) * 1000)
        q.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

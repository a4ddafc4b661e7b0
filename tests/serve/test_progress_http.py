"""Progress through ``quick serve`` (issue 31 point 4): a handler on a remote worker
(``quick worker --remote``'s RemoteWorker) reports ``ctx.progress``; the HTTP status route
shows it while the item runs and after it completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from tests.waiting import wait_for

from .conftest import CountingTransport, Served


def test_a_remote_handlers_progress_is_in_the_status_route_and_kept(served: Served) -> None:
    handlers = Quick.open("memory://")  # only its registry is used: the store is remote
    reported = threading.Event()
    release = threading.Event()

    @handlers.job("export")
    def export(payload: Any, ctx: Any) -> None:
        ctx.progress(0.4, "page 4 of 10")
        reported.set()
        release.wait(30)
        ctx.progress(1.0, "all pages")

    served.q.job("export", keep_status_s=3600)(export)  # the store keeps its status
    item_id = served.q.enqueue("export", b"", app="a", tenant="t")
    h = {"Authorization": f"Bearer {served.a_all}"}
    url = f"{served.url}/v1/apps/a/tenants/t/items/{item_id}"
    try:
        with RemoteQuick(served.url, served.a_all) as client:
            worker = RemoteWorker(handlers.registry, client, workers=1, lease_s=10)
            runner = threading.Thread(target=worker.run_forever, kwargs={"idle_exit": True})
            runner.start()
            try:
                assert reported.wait(30)
                running = httpx.get(url, headers=h).json()
                assert running["state"] == "leased"
                assert (running["progress"], running["progress_note"]) == (0.4, "page 4 of 10")
            finally:
                release.set()
                runner.join(60)
                worker.close()
    finally:
        handlers.close()
    done = httpx.get(url, headers=h).json()
    assert done["state"] == "completed"
    assert (done["progress"], done["progress_note"]) == (1.0, "all pages")


def test_bad_progress_over_http_is_refused_and_stores_nothing(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.enqueue("job", 1, app="a", tenant="t")
        [lease] = rq.lease(max_items=1, wait_s=2)
        h = {"Authorization": f"Bearer {served.a_all}"}
        url = f"{served.url}/v1/apps/a/tenants/t/items/{lease.item_id}/progress"
        for body in ({"fraction": 1.5}, {"fraction": "x"}, {"fraction": 0.5, "note": "n" * 501}):
            r = httpx.post(url, json={"lease_id": lease.lease_id, **body}, headers=h)
            assert r.status_code == 422, (body, r.text)
        r = httpx.post(url, json={"lease_id": "not-mine", "fraction": 0.5}, headers=h)
        assert r.status_code == 409
        assert rq.status("a", "t", lease.item_id).progress is None


def test_a_remote_handler_reporting_in_a_tight_loop_sends_few_requests(served: Served) -> None:
    handlers = Quick.open("memory://")

    @handlers.job("busy")
    def busy(payload: Any, ctx: Any) -> None:
        for i in range(1, 1001):
            ctx.progress(i / 1000, f"step {i}")

    served.q.job("busy", keep_status_s=3600)(busy)
    item_id = served.q.enqueue("busy", b"", app="a", tenant="t")
    transport = CountingTransport()
    try:
        with RemoteQuick(served.url, served.a_all, transport=transport) as client:
            worker = RemoteWorker(handlers.registry, client, workers=1, lease_s=30)
            worker.run_forever(idle_exit=True)
            worker.close()
    finally:
        handlers.close()
    sent = sum(p.endswith("/progress") for p in transport.paths)
    # 1,000 reports in well under a second: the first, then the last when it returns
    # (one more per half second the loop took).
    assert 2 <= sent <= 10, sent
    status = served.q.status("a", "t", item_id)
    assert status is not None and (status.progress, status.progress_note) == (1.0, "step 1000")


def test_quick_worker_remote_process_reports_progress(served: Served, tmp_path: Path) -> None:
    go = tmp_path / "go"
    (tmp_path / "remote_handlers.py").write_text(
        "import os, time\n"
        "from quickzones import Quick\n"
        "quick = Quick.open('memory://')\n"
        "@quick.job('export')\n"
        "def export(payload, ctx):\n"
        "    ctx.progress(0.5, 'half way')\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.05)\n"
        "    ctx.progress(1.0, 'done')\n"
    )
    served.q.job("export", keep_status_s=3600)(lambda payload, ctx: None)
    item_id = served.q.enqueue("export", b"", app="a", tenant="t")
    proc = subprocess.Popen(
        [sys.executable, "-m", "quickzones", "worker", "--app-module", "remote_handlers",
         "--remote", served.url, "--workers", "1"],
        cwd=tmp_path,
        env={**os.environ, "QUICK_TOKEN": served.a_all},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    url = f"{served.url}/v1/apps/a/tenants/t/items/{item_id}"
    h = {"Authorization": f"Bearer {served.a_all}"}
    try:
        assert wait_for(lambda: httpx.get(url, headers=h).json()["progress"] == 0.5, 60)
        assert httpx.get(url, headers=h).json()["progress_note"] == "half way"
        go.write_text("")
        assert wait_for(lambda: httpx.get(url, headers=h).json()["state"] == "completed", 60)
    finally:
        go.write_text("")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    done = httpx.get(url, headers=h).json()
    assert (done["progress"], done["progress_note"]) == (1.0, "done")

"""Progress through ``quick serve`` (issue 31 point 4): a handler on a remote worker
(``quick worker --remote``'s RemoteWorker) reports ``ctx.progress``; the HTTP status route
shows it while the item runs and after it completes."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick

from .conftest import Served


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
        assert rq.status("a", "t", lease.item_id)["progress"] is None

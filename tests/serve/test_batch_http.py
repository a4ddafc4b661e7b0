"""A batch's status through ``quick serve`` (issue 31 point 5):
``GET /v1/apps/{app}/batches/{batch_id}``, for producers of the app."""

from __future__ import annotations

import httpx

from quickzones import Job
from quickzones.adapters.http.client import RemoteQuick

from .conftest import Served


def test_a_batch_status_is_read_over_http_before_and_after_it_runs(served: Served) -> None:
    q = served.q
    batch = q.enqueue_batch(
        [Job("item", n, tenant=f"t{n}") for n in range(3)],
        app="a",
        callback=Job("done", {"k": 1}, tenant="t0"),
    )
    h = {"Authorization": f"Bearer {served.a_produce}"}
    url = f"{served.url}/v1/apps/a/batches/{batch.id}"
    r = httpx.get(url, headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["total"], body["completed"], body["pending"], body["state"]) == (
        3,
        0,
        3,
        "running",
    )
    assert body["callback_id"] == batch.callback_id and body["callback_enqueued"] is False

    q.job("item")(lambda payload, ctx: None)
    q.job("done")(lambda payload, ctx: None)
    while q.run_until_idle():
        pass
    body = httpx.get(url, headers=h).json()
    assert (body["completed"], body["pending"], body["state"]) == (3, 0, "done")
    assert body["callback_enqueued"] is True and body["failed"] == []


def test_an_unknown_batch_is_404_and_another_apps_token_is_403(served: Served) -> None:
    batch = served.q.enqueue_batch(
        [Job("item", 1, tenant="t")], app="a", callback=Job("done", None, tenant="t")
    )
    h = {"Authorization": f"Bearer {served.a_produce}"}
    r = httpx.get(f"{served.url}/v1/apps/a/batches/nope", headers=h)
    assert r.status_code == 404 and r.json()["error"] == "batch_not_found"
    other = {"Authorization": f"Bearer {served.b_all}"}
    assert httpx.get(f"{served.url}/v1/apps/a/batches/{batch.id}", headers=other).status_code == 403


def test_remote_quick_reads_a_batch_status(served: Served) -> None:
    batch = served.q.enqueue_batch(
        [Job("item", 1, tenant="t")], app="a", callback=Job("done", None, tenant="t")
    )
    with RemoteQuick(served.url, served.a_produce) as rq:
        status = rq.batch_status("a", batch.id)
        assert status is not None and status["total"] == 1 and status["state"] == "running"
        assert rq.batch_status("a", "nope") is None

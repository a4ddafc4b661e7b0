"""Job-type policy through ``quick serve`` (issue 28, points 7 and 8): an HTTP producer
enqueues under the policy a worker's registration stored; a different job under a queued
id is refused with its error code."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from quickzones.adapters.http.client import RemoteError, RemoteQuick
from quickzones.client import Quick
from quickzones.registry import JobContext

from .conftest import Served


def test_dedupe_holds_for_an_http_producer(served: Served) -> None:
    worker = Quick(served.q.kv)  # the worker process; the server never imports the handler
    runs: list[Any] = []

    @worker.job("charge", dedupe_s=3600, keep_status_s=3600)
    def charge(payload: Any, ctx: JobContext) -> None:
        runs.append(payload)

    worker.consumer()  # the worker starts: its types' policies are stored
    body = {"job_type": "charge", "payload": {"amount": 5}, "item_id": "order-42"}
    answers = []
    with httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.a_all}"}
    ) as h:
        for _ in range(3):
            r = h.post("/v1/apps/a/tenants/t/items", json=body)
            assert r.status_code == 201, r.text
            answers.append(r.json()["duplicate"])
            worker.run_until_idle()
        state = h.get("/v1/apps/a/tenants/t/items/order-42").json()
    assert runs == [{"amount": 5}]
    assert answers == [None, "completed", "completed"]
    assert state["state"] == "completed"


def test_a_different_job_under_a_queued_id_is_refused_over_http(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.enqueue("charge", {"amount": 5}, app="a", tenant="t", item_id="x-1")
        assert (
            rq.enqueue("charge", {"amount": 5}, app="a", tenant="t", item_id="x-1").duplicate
            == "queued"
        )
        for job, payload in (("refund", {"amount": 5}), ("charge", {"amount": 6})):
            with pytest.raises(RemoteError) as err:
                rq.enqueue(job, payload, app="a", tenant="t", item_id="x-1")
            assert err.value.status == 409 and err.value.error == "duplicate_item_mismatch"
    item = served.q.get("a", "t", "x-1")
    assert item is not None and item.job_type == "charge"

"""Results and status through the HTTP API (issue 28, point 9): a ``--remote`` worker's
handler results are kept as the type's ``keep_result_s`` says; ``RemoteQuick.result()``
and ``status()`` answer as ``Quick``'s do; ``result(timeout=)`` waits, backing off."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from quickzones.adapters.http.client import AsyncRemoteQuick, RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.aio import AsyncQuick
from quickzones.client import Quick
from quickzones.store.outcomes import JobStatus, ResultNotAvailable

from .conftest import CountingTransport, Served


def _app_module(served: Served) -> Quick:
    """The worker's app module: its Quick opens the deployment's store, so the worker's
    start (``quick worker --remote`` calls ``store_type_policies``) stores their types'
    policies there."""
    app = Quick(served.q.kv)

    @app.job("render", keep_result_s=600, keep_status_s=600)
    def render(payload: Any, ctx: Any) -> Any:
        return {"pages": payload["pages"]}

    @app.job("raw", keep_result_s=600)
    def raw(payload: Any, ctx: Any) -> Any:
        return b"\x00\xffpdf"

    @app.job("slow", keep_result_s=600)
    def slow(payload: Any, ctx: Any) -> Any:
        time.sleep(payload)
        return "done"

    app.store_type_policies()  # the remote worker starts, before the producers enqueue
    return app


def _drain(app: Quick, rq: RemoteQuick) -> None:
    worker = RemoteWorker(app.registry, rq, workers=2, lease_s=10)
    worker.run_forever(idle_exit=True)
    worker.close()


def test_a_remote_worker_keeps_results(served: Served) -> None:
    app = _app_module(served)
    with RemoteQuick(served.url, served.a_all) as rq:
        a = rq.enqueue("render", {"pages": 3}, app="a", tenant="t")
        b = rq.enqueue("raw", 1, app="a", tenant="t")
        _drain(app, rq)
        assert rq.result("a", "t", a) == {"pages": 3}
        assert rq.result("a", "t", b) == b"\x00\xffpdf"
        status = rq.status("a", "t", a)
        assert isinstance(status, JobStatus)
        assert status.state == "completed" and status.has_result and status.attempts == 1
        with pytest.raises(ResultNotAvailable, match="unknown item"):
            rq.result("a", "t", "never")
    assert served.q.result("a", "t", a) == {"pages": 3}


def test_remote_result_waits_without_polling_fast(served: Served) -> None:
    app = _app_module(served)
    counting = CountingTransport()
    with (
        RemoteQuick(served.url, served.a_all) as rq,
        RemoteQuick(served.url, served.a_all, transport=counting) as waiter,
    ):
        item = rq.enqueue("slow", 1.5, app="a", tenant="t")
        with pytest.raises(ResultNotAvailable, match="not finished"):
            waiter.result("a", "t", item)  # no timeout: answers at once
        runner = threading.Thread(target=_drain, args=(app, rq))
        runner.start()
        assert waiter.result("a", "t", item, timeout=30) == "done"
        runner.join()
    polls = [p for p in counting.paths if p.endswith("/result")]
    assert 2 <= len(polls) <= 12  # 1.5 s of backoff, not a busy loop


def test_async_remote_result_waits(served: Served) -> None:
    app = _app_module(served)

    async def main() -> Any:
        async with AsyncRemoteQuick(served.url, served.a_all) as arq:
            item = await arq.enqueue("slow", 0.3, app="a", tenant="t")
            with RemoteQuick(served.url, served.a_all) as rq:
                runner = threading.Thread(target=_drain, args=(app, rq))
                runner.start()
                got = await arq.result("a", "t", item, timeout=30)
                status = await arq.status("a", "t", item)
                runner.join()
            return got, status

    got, status = asyncio.run(main())
    assert got == "done" and isinstance(status, JobStatus) and status.state == "completed"


def test_quick_result_waits_sync_and_async(served: Served) -> None:
    app = _app_module(served)
    q = served.q
    item = q.enqueue("slow", 0.3, app="a", tenant="t")
    consumer = app.consumer()
    consumer.start()  # its threads, in the background
    try:
        assert q.result("a", "t", item, timeout=30) == "done"
        other = q.enqueue("slow", 0.3, app="a", tenant="t")
        assert asyncio.run(AsyncQuick(q).result("a", "t", other, timeout=30)) == "done"
    finally:
        consumer.stop()


def test_a_pull_consumer_completes_with_a_result(served: Served) -> None:
    _app_module(served)  # stores the types' policies
    with RemoteQuick(served.url, served.a_all) as rq:
        one = rq.enqueue("render", {"pages": 1}, app="a", tenant="t")
        two = rq.enqueue("raw", 2, app="a", tenant="u")
        leases = {x.item_id: x for x in rq.lease(max_items=2, wait_s=2)}
        rq.complete(leases[one], {"pages": 1, "url": "/out/1.pdf"})
        assert rq.complete_many([leases[two]], [b"\x01bytes"]) == [None]
        assert rq.result("a", "t", one) == {"pages": 1, "url": "/out/1.pdf"}
        assert rq.result("a", "u", two) == b"\x01bytes"
        bad = {"lease_id": "x", "result": 1, "result_b64": "AA=="}
        answer = httpx.post(
            f"{served.url}/v1/apps/a/tenants/t/items/{one}/complete",
            json=bad,
            headers={"Authorization": f"Bearer {served.a_all}"},
        )
        assert answer.status_code in (400, 422)

"""What a failed run leaves for its retries (``JobContext.retry_meta``) on the remote
worker's path (issue 45 point 1, review edge 3): a remote handler's ``retry_meta`` reaches
its next attempt through ``POST .../nack`` (``meta``) and the lease's ``meta``, as a local
one's does (tests/unit/test_retry_meta.py); a nack whose ``meta`` is not a JSON object of
the handler's own keys, or is too big, is a 422 naming ``meta``, and changes nothing."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from quickzones.adapters.http.client import RemoteQuick
from quickzones.adapters.http.worker import RemoteWorker
from quickzones.client import Quick
from quickzones.errors import Nack
from quickzones.registry import JobContext, RetryPolicy
from tests.waiting import wait_for

from .conftest import Served


def test_a_remote_handlers_retry_meta_reaches_its_next_attempt(served: Served) -> None:
    handlers = Quick.open("memory://")
    seen: list[dict[str, object]] = []

    policy = RetryPolicy(max_attempts=3, backoff_base_s=0.05, jitter=False)

    @handlers.job("sync", retry=policy)
    def sync(payload: object, ctx: JobContext) -> None:
        seen.append(ctx.meta)
        tries = ctx.meta.get("tries", [])
        ctx.retry_meta["tries"] = [*tries, ctx.attempt]  # type: ignore[misc]
        raise ConnectionError(f"run {ctx.attempt}: down")

    item_id = served.q.enqueue("sync", b"", app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        worker = RemoteWorker(handlers.registry, client, workers=1, lease_s=5, wait_s=0.2)
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        thread.start()
        try:
            assert wait_for(lambda: bool(served.q.dead_letters("a", "t")))
        finally:
            worker.request_stop()
            thread.join(30)
            worker.close()
    handlers.close()
    assert seen == [{}, {"tries": [1]}, {"tries": [1, 2]}]
    letters = served.q.dead_letters("a", "t")
    assert [(d.item.item_id, d.item.meta.get("tries")) for d in letters if d.item] == [
        (item_id, [1, 2])  # the last run's is not retried: its error is the letter's
    ]


def test_a_remote_nacks_meta_reaches_its_next_attempt(served: Served) -> None:
    handlers = Quick.open("memory://")
    seen: list[dict[str, object]] = []

    @handlers.job("poll")
    def poll(payload: object, ctx: JobContext) -> None:
        seen.append(ctx.meta)
        if len(seen) < 3:
            raise Nack(0.0, {"polls": len(seen)})

    served.q.enqueue("poll", b"", app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        worker = RemoteWorker(handlers.registry, client, workers=1, lease_s=5, wait_s=0.2)
        thread = threading.Thread(target=worker.run_forever, daemon=True)
        thread.start()
        try:
            assert wait_for(lambda: worker.stats.completed == 1)
        finally:
            worker.request_stop()
            thread.join(30)
            worker.close()
    handlers.close()
    assert seen == [{}, {"polls": 1}, {"polls": 2}]


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ([1, 2], "object"),
        ("tries", "object"),
        ({"_k": ["s", "hijack", 0, -1]}, "_"),
        ({"": 1}, "empty"),
        ({"big": "x" * 20_000}, "16384"),
    ],
)
def test_a_bad_nack_meta_is_a_422_and_changes_nothing(served: Served, meta: Any, says: str) -> None:
    item_id = served.q.enqueue("sync", b"", app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as client:
        [lease] = client.lease(1, lease_s=30)
        answer = httpx.post(
            f"{served.url}/v1/apps/a/tenants/t/items/{item_id}/nack",
            json={"lease_id": lease.lease_id, "delay_s": 0, "error": "down", "meta": meta},
            headers={"Authorization": f"Bearer {served.a_all}"},
            timeout=30,
        )
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["error"] == "invalid_request"
        assert "meta" in body["detail"] and says in body["detail"]
        item = served.q.get("a", "t", item_id)
        assert item is not None and item.lease_id == lease.lease_id and item.error_count == 0
        assert item.meta == {}
        # The lease still holds: a good nack is taken.
        client.nack(lease, delay_s=0, error="down", meta={"tries": [1]})
    item = served.q.get("a", "t", item_id)
    assert item is not None and item.lease_id is None and item.meta == {"tries": [1]}


def test_a_lease_carries_the_meta_json_can_carry(served: Served) -> None:
    # A local handler's nack may leave bytes in the item's metadata: the lease still
    # answers, with the rest.
    item_id = served.q.enqueue("sync", b"", app="a", tenant="t")
    zone = served.q.zone("a", "t")
    [local], _ = served.q.items.dequeue(zone, 1, 30_000)
    assert local.lease_id is not None
    served.q.items.requeue(zone, item_id, local.lease_id, 0, meta={"raw": b"\xff", "n": 1})
    with RemoteQuick(served.url, served.a_all) as client:
        [lease] = client.lease(1, lease_s=30)
    assert lease.item_id == item_id and lease.meta == {"n": 1}

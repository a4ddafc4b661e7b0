"""Idempotency and debounce keys through ``quick serve``'s enqueue route (issue 45
point 1): body fields ``idempotency_key``, ``idempotency_ttl_s`` and ``debounce``, the
``Idempotency-Key`` header, and the Python client's options."""

from __future__ import annotations

import httpx

from quickzones import Debounce
from quickzones.adapters.http.client import RemoteError, RemoteQuick

from .conftest import Served

ITEMS = "/v1/apps/a/tenants/t1/items"


def _post(served: Served, body: dict[str, object], **headers: str) -> httpx.Response:
    h = {"Authorization": f"Bearer {served.a_all}", **headers}
    return httpx.post(served.url + ITEMS, json={"job_type": "job", **body}, headers=h)


def test_an_idempotency_key_returns_the_held_items_id_until_it_finishes(served: Served) -> None:
    first = _post(served, {"payload": 1, "idempotency_key": "order-7"})
    assert first.status_code == 201 and first.json()["duplicate"] is None
    item_id = first.json()["item_id"]
    again = _post(served, {"payload": 2}, **{"Idempotency-Key": "order-7"})
    assert again.status_code == 201
    assert again.json() == {"item_id": item_id, "duplicate": "queued"}
    with RemoteQuick(served.url, served.a_all) as rq:
        [lease] = rq.lease(max_items=10, wait_s=5)
        assert lease.item_id == item_id and lease.payload == 1
        running = rq.enqueue("job", 3, app="a", tenant="t1", idempotency_key="order-7")
        assert running == item_id and running.duplicate == "queued"
        rq.complete(lease)
        fresh = rq.enqueue("job", 4, app="a", tenant="t1", idempotency_key="order-7")
        assert fresh != item_id and fresh.duplicate is None


def test_a_ttl_holds_the_key_after_the_item_finished(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        first = rq.enqueue(
            "job", 1, app="a", tenant="t1", idempotency_key="k", idempotency_ttl_s=3600
        )
        [lease] = rq.lease(max_items=10, wait_s=5)
        rq.complete(lease)
        again = rq.enqueue("job", 1, app="a", tenant="t1", idempotency_key="k")
        assert again == first and again.duplicate == "completed"


def test_debounced_enqueues_keep_one_item_with_the_newest_payload(served: Served) -> None:
    debounce = {"key": "doc-1", "wait_s": 0.3, "max_wait_s": 30}
    ids = [_post(served, {"payload": n, "debounce": debounce}).json() for n in range(5)]
    assert len({r["item_id"] for r in ids}) == 1
    assert [r["duplicate"] for r in ids] == [None] + ["debounced"] * 4
    with RemoteQuick(served.url, served.a_all) as rq:
        again = rq.enqueue("job", 5, app="a", tenant="t1", debounce=Debounce("doc-1", 0.3, 30))
        assert again == ids[0]["item_id"] and again.duplicate == "debounced"
        leased = rq.lease(max_items=10, wait_s=10)
        assert [(x.item_id, x.payload) for x in leased] == [(again, 5)]


def test_bad_flow_keys_are_a_clear_400_and_store_nothing(served: Served) -> None:
    cases = [
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_ttl_s": 5}, "idempotency_ttl_s"),
        ({"debounce": {"key": "k", "wait_s": 2, "max_wait_s": 1}}, "debounce.max_wait_s"),
        ({"debounce": {"key": "", "wait_s": 1, "max_wait_s": 2}}, "debounce.key"),
        (
            {"idempotency_key": "k", "debounce": {"key": "k", "wait_s": 1, "max_wait_s": 2}},
            "debounce",
        ),
    ]
    for body, field in cases:
        r = _post(served, {"payload": 1, **body})
        assert r.status_code == 400, (body, r.text)
        assert field in r.json()["detail"], (body, r.text)
    r = _post(served, {"payload": 1, "idempotency_key": "a"}, **{"Idempotency-Key": "b"})
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["detail"]
    assert served.q.zones.count(served.q.zone("a", "t1")) == 0
    with RemoteQuick(served.url, served.a_all) as rq:
        try:
            rq.enqueue("job", 1, app="a", tenant="t1", idempotency_key="")
        except RemoteError as err:
            assert err.status == 400
        else:
            raise AssertionError("an empty key was accepted")


def test_one_at_a_time_keys_are_leased_one_at_a_time_in_enqueue_order(served: Served) -> None:
    """The body field and the client's option; ``POST /v1/leases`` leases a key's next
    item only once its holder finished."""
    first = _post(served, {"payload": 1, "one_at_a_time": "acct-7", "priority": 5})
    assert first.status_code == 201, first.text
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.enqueue("job", 2, app="a", tenant="t1", one_at_a_time="acct-7", priority=-5)
        rq.enqueue("job", 3, app="a", tenant="t1")
        leased = rq.lease(max_items=10, wait_s=5)
        assert sorted(x.payload for x in leased) == [1, 3]
        assert rq.lease(max_items=10, wait_s=0.3) == []
        for lease in leased:
            rq.complete(lease)
        [second] = rq.lease(max_items=10, wait_s=5)
        assert second.payload == 2
    bad = _post(served, {"payload": 1, "one_at_a_time": ""})
    assert bad.status_code == 400 and "one_at_a_time" in bad.json()["detail"]

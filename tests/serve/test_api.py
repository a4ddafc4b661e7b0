"""The HTTP API end to end over real HTTP, through the Python client and raw httpx."""

from __future__ import annotations

import time

import httpx
import pytest

from quickzones.adapters.http.client import RemoteError, RemoteLease, RemoteQuick
from quickzones.errors import LeaseLost

from .conftest import Served


def _client(served: Served, token: str) -> RemoteQuick:
    return RemoteQuick(served.url, token)


def test_enqueue_lease_complete_round_trip(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        item_id = rq.enqueue("email", {"to": "x@example.com"}, app="a", tenant="t1")
        raw_id = rq.enqueue("blob", b"\x00\xffbytes", app="a", tenant="t2", priority=-1)
        assert rq.status("a", "t1", item_id).state == "queued"
        leases = rq.lease(max_items=10, wait_s=2)
        assert {x.item_id for x in leases} == {item_id, raw_id}
        by_id = {x.item_id: x for x in leases}
        assert by_id[item_id].payload == {"to": "x@example.com"}
        assert by_id[raw_id].payload == b"\x00\xffbytes"
        assert rq.status("a", "t1", item_id).state == "leased"
        for lease in leases:
            rq.complete(lease)
        assert served.q.get("a", "t1", item_id) is None
        assert served.q.get("a", "t2", raw_id) is None


def test_enqueue_many_idempotent_id_and_cancel(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        ids = rq.enqueue_many("job", [1, 2, {"k": 3}], app="a", tenant="t")
        assert len(ids) == 3 and all(served.q.get("a", "t", i) for i in ids)
        first = rq.enqueue("job", {"n": 1}, app="a", tenant="t", item_id="fixed")
        again = rq.enqueue("job", {"n": 1}, app="a", tenant="t", item_id="fixed")
        assert first == again == "fixed" and again.duplicate == "queued"
        rq.cancel("a", "t", "fixed")
        assert served.q.get("a", "t", "fixed") is None
        with pytest.raises(Exception) as err:
            rq.cancel("a", "t", "fixed")
        assert "fixed" in str(err.value)
        assert rq.status("a", "t", "never") is None


def test_delay_and_priority_are_kept(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        later = rq.enqueue("job", 1, app="a", tenant="t", delay=3600)
        assert rq.lease(max_items=5) == []
        item = served.q.get("a", "t", later)
        assert item is not None and item.vesting_ms > item.enqueued_ms + 3_000_000
        low = rq.enqueue("job", 1, app="a", tenant="t", priority=5)
        high = rq.enqueue("job", 1, app="a", tenant="t", priority=-5)
        got = rq.lease(max_items=5, wait_s=1)
        assert [x.item_id for x in got] == [high, low]


def test_lost_lease_is_409_with_a_clear_body(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        rq.enqueue("job", 1, app="a", tenant="t")
        [lease] = rq.lease(lease_s=0.2, wait_s=1)
        time.sleep(0.4)
        [again] = rq.lease(wait_s=2)  # expired: another consumer takes it
        assert again.item_id == lease.item_id and again.lease_id != lease.lease_id
        with pytest.raises(LeaseLost):
            rq.complete(lease)
        path = f"/v1/apps/a/tenants/t/items/{lease.item_id}/complete"
        r = httpx.post(served.url + path, json={"lease_id": lease.lease_id},
                       headers={"Authorization": f"Bearer {served.a_all}"})  # fmt: skip
        assert r.status_code == 409
        assert r.json()["error"] == "lease_lost" and "lease" in r.json()["detail"]
        assert r.json()["item_id"] == lease.item_id
        rq.complete(again)  # the holder still can
        with pytest.raises(LeaseLost):  # gone now: still a 409 for the old holder
            rq.extend(lease)


def test_extend_nack_and_fail(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        item_id = rq.enqueue("job", {"x": 1}, app="a", tenant="t")
        [lease] = rq.lease(lease_s=5, wait_s=1)
        assert rq.extend(lease, lease_s=60) > lease.lease_expires_ms
        rq.nack(lease, delay_s=0, error="try again")
        [second] = rq.lease(wait_s=2)
        assert second.item_id == item_id and second.error_count == 1
        assert second.last_error == "try again"
        rq.fail(second, "bad input", traceback="Traceback...\nValueError: bad")
        assert served.q.get("a", "t", item_id) is None
        letters = rq.dead_letters("a")
        assert [x["item_id"] for x in letters] == [item_id]
        assert letters[0]["reason"] == "bad input"
        assert "ValueError" in letters[0]["traceback"]
        assert rq.status("a", "t", item_id).state == "dead_lettered"


def test_long_poll_returns_an_item_enqueued_while_waiting(served: Served) -> None:
    import threading

    with _client(served, served.a_all) as rq:
        timer = threading.Timer(0.3, lambda: served.q.enqueue("job", 1, app="a", tenant="late"))
        timer.start()
        got = rq.lease(wait_s=10)
        timer.join()
        assert [x.tenant for x in got] == ["late"]


def test_one_visit_takes_at_most_a_zones_share_of_the_lease(served: Served) -> None:
    """Water-filling over a pull lease: the noisy zone gives at most its share of the
    request over the zones its scan saw vested (work-conserving visits, the default; it
    was ``dequeue_max`` 10 before issue 29), and every small tenant's item comes in the
    same lease."""
    with _client(served, served.a_all) as rq:
        rq.enqueue_many("job", list(range(50)), app="a", tenant="noisy")
        for n in range(5):
            rq.enqueue("job", n, app="a", tenant=f"small{n}")
        got = rq.lease(max_items=100, wait_s=1)
        per_zone: dict[str, int] = {}
        for x in got:
            per_zone[x.tenant] = per_zone.get(x.tenant, 0) + 1
        assert all(per_zone.get(f"small{n}") == 1 for n in range(5)), per_zone
        assert per_zone.get("noisy", 0) <= 100 - 5


def test_pull_consumer_gets_only_its_apps_items(served: Served) -> None:
    served.q.enqueue("job", 1, app="b", tenant="t")
    with _client(served, served.a_all) as rq:
        assert rq.lease(max_items=10, wait_s=0.3) == []
        rq.enqueue("job", 1, app="a", tenant="t")
        got = rq.lease(max_items=10, wait_s=1)
        assert [x.app for x in got] == ["a"]
    with _client(served, served.operator) as op:
        got = op.lease(max_items=10, wait_s=1, app="*")
        assert [x.app for x in got] == ["b"]


def test_job_type_filter(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        rq.enqueue("other", 2, app="a", tenant="t")  # first in the zone: skipped over
        rq.enqueue("wanted", 1, app="a", tenant="t")
        rq.enqueue("wanted", 3, app="a", tenant="t")
        got = rq.lease(max_items=1, wait_s=1, job_types=["wanted"])
        assert [x.job_type for x in got] == ["wanted"]
        got = rq.lease(max_items=10, wait_s=1, job_types=["wanted"])
        assert [x.job_type for x in got] == ["wanted"]
        assert served.q.get("a", "t", got[0].item_id) is not None


def test_dead_letters_filters_requeue_and_purge(served: Served) -> None:
    q = served.q
    with _client(served, served.a_all) as rq:
        for tenant, job in [("t1", "x"), ("t1", "y"), ("t2", "x")]:
            rq.enqueue(job, 1, app="a", tenant=tenant, item_id=f"{tenant}-{job}")
        for lease in rq.lease(max_items=10, wait_s=1):
            rq.fail(lease, f"failed {lease.item_id}")
        assert len(rq.dead_letters("a")) == 3
        assert {x["item_id"] for x in rq.dead_letters("a", tenant="t1")} == {"t1-x", "t1-y"}
        assert {x["item_id"] for x in rq.dead_letters("a", job_type="x")} == {"t1-x", "t2-x"}
        assert rq.requeue_dead_letters("a", tenant="t2") == 1
        assert q.get("a", "t2", "t2-x") is not None
        assert rq.purge_dead_letters("a", job_type="y") == 1
        assert [x["item_id"] for x in rq.dead_letters("a")] == ["t1-x"]


def test_dead_letters_requeue_and_purge_take_a_limit(served: Served) -> None:
    """Issue 28 point 16: bulk requeue and purge through the HTTP API, at most ``limit``."""
    q = served.q
    with _client(served, served.a_all) as rq:
        for n in range(5):
            rq.enqueue("x", n, app="a", tenant=f"t{n % 2}", item_id=f"i{n}")
        for lease in rq.lease(max_items=10, wait_s=1):
            rq.fail(lease, "no")
        assert len(rq.dead_letters("a")) == 5
        assert rq.requeue_dead_letters("a", job_type="x", limit=2) == 2
        assert len(rq.dead_letters("a")) == 3 and q.zones.count(q.zone("a", "t0")) >= 1
        assert rq.purge_dead_letters("a", tenant="t0", limit=1) == 1
        assert len(rq.dead_letters("a")) == 2
        with pytest.raises(RemoteError):
            rq.purge_dead_letters("a", limit=0)
        assert len(rq.dead_letters("a")) == 2


def test_enqueue_takes_an_iso_run_at(served: Served) -> None:
    """Issue 28 point 18: an absolute run-at time through the HTTP API, with its offset."""
    q = served.q
    headers = {"Authorization": f"Bearer {served.a_all}"}
    soon = time.time() + 3600
    iso = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(soon))
    with httpx.Client(base_url=served.url, headers=headers) as http:
        one = http.post(
            "/v1/apps/a/tenants/t/items", json={"job_type": "j", "payload": 1, "run_at": iso}
        )
        assert one.status_code == 201, one.text
        many = http.post(
            "/v1/apps/a/tenants/t/batches",
            json={"job_type": "j", "items": [{"payload": 2}], "run_at": iso.replace("+00:00", "Z")},
        )
        assert many.status_code == 201, many.text
        for item_id in [one.json()["item_id"], *many.json()["item_ids"]]:
            item = q.get("a", "t", item_id)
            assert item is not None and abs(item.vesting_ms - int(soon) * 1000) < 60_000
        naive = http.post(
            "/v1/apps/a/tenants/t/items",
            json={"job_type": "j", "payload": 3, "run_at": iso[:19], "item_id": "naive"},
        )
        both = http.post(
            "/v1/apps/a/tenants/t/items",
            json={"job_type": "j", "payload": 4, "run_at": iso, "delay_s": 5, "item_id": "both"},
        )
    assert naive.status_code == 422 and "timezone" in naive.text.lower()
    assert both.status_code == 400 and "not both" in both.text
    assert q.get("a", "t", "naive") is None and q.get("a", "t", "both") is None


def test_admin_stats_zones_and_items(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        rq.enqueue_many("job", [1, 2, 3], app="a", tenant="deep")
        rq.enqueue("mail", 1, app="a", tenant="shallow")
        rq.enqueue("job", 1, app="a", tenant="later", delay=600)
        served.q.enqueue("job", 1, app="b", tenant="hidden")
        stats = rq.stats("a")
        assert stats["items"] == 5 and stats["vested"] == 4
        assert stats["by_job_type"] == {"job": 4, "mail": 1}
        assert stats["active_zones"] == 3
        h = {"Authorization": f"Bearer {served.a_all}"}
        zones = httpx.get(served.url + "/v1/apps/a/zones", params={"limit": 2}, headers=h).json()
        assert len(zones["zones"]) == 2 and zones["next_cursor"] and "total" not in zones
        found = httpx.get(served.url + "/v1/apps/a/zones", params={"search": "sha"},
                          headers=h).json()  # fmt: skip
        assert [z["tenant"] for z in found["zones"]] == ["shallow"]
        items = httpx.get(served.url + "/v1/apps/a/tenants/deep/items", headers=h).json()
        assert items["total"] == 3 and {i["state"] for i in items["items"]} == {"vested"}
        op = {"Authorization": f"Bearer {served.operator}"}
        shards = httpx.get(served.url + "/v1/shards", headers=op).json()
        assert shards["shards"][0]["pointers"] == 4


def test_bad_input_is_a_clear_4xx_and_stores_nothing(served: Served) -> None:
    h = {"Authorization": f"Bearer {served.a_all}"}
    url = served.url + "/v1/apps/a/tenants/t/items"
    for body, code in [
        ({"job_type": "9bad"}, 422),
        ({"job_type": "ok", "priority": 10**9}, 422),
        ({"job_type": "ok", "delay_s": -1}, 422),
        ({"job_type": "ok", "payload": 1, "payload_b64": "AA=="}, 422),
        ({"job_type": "ok", "payload_b64": "!!!"}, 400),
        ({"job_type": "ok", "surprise": 1}, 422),
    ]:
        r = httpx.post(url, json=body, headers=h)
        assert r.status_code == code, (body, r.text)
        assert r.json()["error"] and r.json()["detail"]
    r = httpx.post(served.url + "/v1/apps/a/tenants/%0A/items", json={"job_type": "ok"}, headers=h)
    assert r.status_code == 400 and "tenant" in r.json()["detail"]
    assert served.q.run_until_idle() == 0


def test_body_size_limit(served: Served) -> None:
    h = {"Authorization": f"Bearer {served.a_all}"}
    url = served.url + "/v1/apps/a/tenants/t/items"
    r = httpx.post(url, json={"job_type": "ok", "payload": "x" * 100_000}, headers=h)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"

    def chunks():  # no Content-Length: the limit still holds
        yield b'{"job_type": "ok", "payload": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}'

    r = httpx.post(url, content=chunks(), headers={**h, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert served.q.run_until_idle() == 0


def test_openapi_document_is_versioned(served: Served) -> None:
    doc = httpx.get(served.url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    paths = set(doc["paths"])
    assert "/v1/leases" in paths and "/v1/apps/{app}/tenants/{tenant}/items" in paths
    assert all(p.startswith("/v1/") for p in paths)


def test_remote_error_names_the_problem(served: Served) -> None:
    with _client(served, served.a_all) as rq, pytest.raises(RemoteError) as err:
        rq.enqueue("job", 1, app="a", tenant="line\nbreak")
    assert err.value.status == 400 and err.value.error == "invalid_argument"
    assert "tenant" in err.value.detail
    with _client(served, served.a_all) as rq, pytest.raises(RemoteError) as err:
        rq.enqueue("not a type", 1, app="a", tenant="t")
    assert err.value.status == 422 and "job_type" in err.value.detail


def test_async_client_round_trip(served: Served) -> None:
    import asyncio

    from quickzones.adapters.http.client import AsyncRemoteQuick

    async def main() -> None:
        async with AsyncRemoteQuick(served.url, served.a_all) as rq:
            ids = await rq.enqueue_many("job", [1, 2], app="a", tenant="t")
            one = await rq.enqueue("job", b"raw", app="a", tenant="u")
            assert (await rq.status("a", "u", one)).state == "queued"
            leases = await rq.lease(max_items=10, wait_s=2)
            assert {x.item_id for x in leases} == {*ids, one}
            first, second, third = sorted(leases, key=lambda x: x.item_id)
            await rq.extend(first, 60)
            await rq.complete(first)
            await rq.nack(second, delay_s=3600)
            await rq.fail(third, "no")
            with pytest.raises(LeaseLost):
                await rq.complete(first)
            await rq.cancel("a", second.tenant, second.item_id)
            assert await rq.status("a", "t", "missing") is None

    asyncio.run(main())
    assert len(served.q.dead_letters("a")) == 1


def test_ttl_item_not_started_in_time_is_dead_lettered(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        item_id = rq.enqueue("job", 1, app="a", tenant="t", ttl=0.05)
        time.sleep(0.3)
        assert rq.lease(max_items=5, wait_s=0.5) == []
        [letter] = rq.dead_letters("a")
        assert letter["item_id"] == item_id and "expired" in letter["reason"]


def _lease_all(rq: RemoteQuick, n: int, app: str) -> list[RemoteLease]:
    """Lease until ``n`` items are held (one lease visits only some of the zones)."""
    got: list[RemoteLease] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        got += rq.lease(max_items=n - len(got), wait_s=1, app=app)
    assert len(got) == n
    return got


def test_complete_many_reports_each_outcome(served: Served) -> None:
    with _client(served, served.operator) as rq:
        rq.enqueue("job", "old", app="a", tenant="t0", item_id="lost")  # the oldest zone
        [stale] = rq.lease(lease_s=0.2, wait_s=2, app="a")
        assert stale.item_id == "lost"
        time.sleep(0.4)  # its lease expires: the next lease gives it to another holder
        ids = [rq.enqueue("job", n, app=app, tenant=tenant) for n, (app, tenant) in
               enumerate([("a", "t1"), ("a", "t1"), ("a", "t2"), ("b", "t")])]  # fmt: skip
        rq.enqueue("job", "gone", app="a", tenant="t4", item_id="gone")
        by_id = {x.item_id: x for x in _lease_all(rq, 6, "*")}
        rq.cancel("a", "t4", "gone")
        order = [by_id[ids[2]], stale, by_id[ids[3]], by_id["gone"], by_id[ids[0]], by_id[ids[1]]]
        outcomes = rq.complete_many(order)
        assert [type(x).__name__ for x in outcomes] == [
            "NoneType", "LeaseLost", "NoneType", "ItemGone", "NoneType", "NoneType"]  # fmt: skip
        for item_id, app, tenant in [(ids[0], "a", "t1"), (ids[1], "a", "t1"),
                                     (ids[2], "a", "t2"), (ids[3], "b", "t")]:  # fmt: skip
            assert served.q.get(app, tenant, item_id) is None
        assert served.q.get("a", "t0", "lost") is not None  # its new holder still has it
        stale_ref = {"app": "a", "tenant": "t0", "item_id": "lost", "lease_id": stale.lease_id}
        gone_ref = {"app": "a", "tenant": "t4", "item_id": "gone", "lease_id": "l"}
        r = httpx.post(served.url + "/v1/completions", json={"items": [stale_ref, gone_ref]},
                       headers={"Authorization": f"Bearer {served.operator}"})  # fmt: skip
        assert r.status_code == 200
        assert r.json() == {"results": [
            {"app": "a", "tenant": "t0", "item_id": "lost", "outcome": "lease_lost"},
            {"app": "a", "tenant": "t4", "item_id": "gone", "outcome": "item_gone"}]}  # fmt: skip
        rq.complete_many([by_id["lost"]])
        assert rq.complete_many([]) == []
    assert served.q.run_until_idle() == 0


def test_complete_many_refuses_bad_input_and_completes_nothing(served: Served) -> None:
    with _client(served, served.a_all) as rq:
        rq.enqueue("job", 1, app="a", tenant="t")
        [lease] = rq.lease(wait_s=2)
    served.q.enqueue("job", 2, app="b", tenant="t", item_id="b-item")
    one = {"app": "a", "tenant": "t", "item_id": lease.item_id, "lease_id": lease.lease_id}
    other_app = {"app": "b", "tenant": "t", "item_id": "b-item", "lease_id": "x"}
    headers = {"Authorization": f"Bearer {served.a_all}"}

    def post(body: object, token_headers: dict[str, str] = headers) -> httpx.Response:
        return httpx.post(served.url + "/v1/completions", json=body, headers=token_headers)

    r = post({"items": [one, other_app]})
    assert r.status_code == 403 and r.json()["error"] == "forbidden_app"
    r = post({"items": [one, dict(one)]})
    assert r.status_code == 400 and r.json()["error"] == "duplicate_item"
    assert lease.item_id in r.json()["detail"] and "items[1]" in r.json()["detail"]
    r = post({"items": [{**one, "tenant": "bad\nname"}]})
    assert r.status_code == 400 and "tenant" in r.json()["detail"]
    assert post({"items": []}).status_code == 422
    assert post({"items": [{**one, "lease_id": ""}]}).status_code == 422
    producer_only = {"Authorization": f"Bearer {served.a_produce}"}
    assert post({"items": [one]}, producer_only).status_code == 403
    assert served.q.get("a", "t", lease.item_id) is not None  # nothing was completed
    assert post({"items": [one]}).json()["results"][0]["outcome"] == "completed"
    assert served.q.get("a", "t", lease.item_id) is None


def test_async_client_complete_many(served: Served) -> None:
    import asyncio

    from quickzones.adapters.http.client import AsyncRemoteQuick

    async def main() -> list[object]:
        async with AsyncRemoteQuick(served.url, served.a_all) as rq:
            await rq.enqueue("job", 1, app="a", tenant="t")
            await rq.enqueue("job", 2, app="a", tenant="u")
            leases = await rq.lease(max_items=5, wait_s=2)
            assert len(leases) == 2
            return list(await rq.complete_many(leases))

    assert asyncio.run(main()) == [None, None]
    assert served.q.run_until_idle() == 0

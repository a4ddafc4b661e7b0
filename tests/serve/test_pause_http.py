"""Pause and resume through ``quick serve`` (issue 31 point 3): admin routes, the Python
client, and the pull leaser, which holds back what every consumer holds back."""

from __future__ import annotations

import httpx

from quickzones.adapters.http.client import RemoteError, RemoteQuick

from .conftest import Served


def test_a_paused_tenant_is_not_leased_to_pull_consumers_until_resumed(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        paused = rq.pause("a", tenant="t1")
        assert (paused["app"], paused["tenant"], paused["job_type"]) == ("a", "t1", None)
        held = rq.enqueue("job", 1, app="a", tenant="t1")  # enqueues are still accepted
        other = rq.enqueue("job", 2, app="a", tenant="t2")
        # A long poll answers once it has something: the wait bounds a loaded host's scans
        # (CI: nothing within 1 s, the paused zone's visit first), not the answer's speed.
        got = rq.lease(max_items=10, wait_s=5)
        assert [x.item_id for x in got] == [other]
        assert rq.status("a", "t1", held).state == "queued"
        assert [(p["tenant"], p["job_type"]) for p in rq.paused("a")] == [("t1", None)]
        assert rq.stats("a")["paused"][0]["tenant"] == "t1"
        assert rq.resume("a", tenant="t1") is True
        assert rq.resume("a", tenant="t1") is False
        got = rq.lease(max_items=10, wait_s=5)  # its pointer vests again within a second
        assert [x.item_id for x in got] == [held]
        assert rq.stats("a")["paused"] == []


def test_a_paused_job_type_is_left_for_later(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.pause("a", job_type="report")
        report = rq.enqueue("report", 1, app="a", tenant="t")
        mail = rq.enqueue("mail", 1, app="a", tenant="t")
        assert [x.item_id for x in rq.lease(max_items=10, wait_s=1)] == [mail]
        assert served.q.status("a", "t", report).attempts == 0  # type: ignore[union-attr]
        rq.resume("a", job_type="report")
        assert [x.item_id for x in rq.lease(max_items=10, wait_s=5)] == [report]


def test_pause_routes_need_the_admin_role_for_the_app(served: Served) -> None:
    url = served.url + "/v1/apps/a/pauses"
    for token, status in ((served.a_produce, 403), (served.b_all, 403), ("nope", 401)):
        h = {"Authorization": f"Bearer {token}"}
        assert httpx.post(url, json={"tenant": "t"}, headers=h).status_code == status
        assert httpx.get(url, headers=h).status_code == status
        assert httpx.delete(url, params={"tenant": "t"}, headers=h).status_code == status
    assert served.q.paused() == []


def test_a_bad_pause_is_a_clear_400_and_stores_nothing(served: Served) -> None:
    h = {"Authorization": f"Bearer {served.a_all}"}
    url = served.url + "/v1/apps/a/pauses"
    r = httpx.post(url, json={"tenant": ""}, headers=h)
    assert r.status_code == 400 and "tenant" in r.json()["detail"]
    r = httpx.post(url, json={"tenant": "t", "color": "red"}, headers=h)
    assert r.status_code == 422 and "color" in r.text  # the server's schema errors
    with RemoteQuick(served.url, served.a_all) as rq:
        try:
            rq.pause("a", tenant="\n")
        except RemoteError as err:
            assert err.status == 400
        else:
            raise AssertionError("a tenant with a line break was paused")
    assert served.q.paused() == []

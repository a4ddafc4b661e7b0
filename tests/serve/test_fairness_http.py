"""Tenant weights and limits through ``quick serve`` (issue 31 points 1 and 2): admin
routes that store what every consumer reads."""

from __future__ import annotations

import httpx

from quickzones.adapters.http.client import RemoteError, RemoteQuick
from quickzones.store.tenant_limits import TenantLimit
from quickzones.store.weights import TenantWeight

from .conftest import Served


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_weights_are_set_listed_and_cleared_by_an_admin(served: Served) -> None:
    url = served.url + "/v1/apps/a/weights"
    h = _h(served.a_all)
    r = httpx.put(url, json={"tenant": "gold", "weight": 3}, headers=h)
    assert r.status_code == 200 and r.json() == {"app": "a", "tenant": "gold", "weight": 3.0}
    assert httpx.put(url, json={"weight": 2}, headers=h).status_code == 200  # app default
    assert served.q.weights() == [TenantWeight("a", None, 2.0), TenantWeight("a", "gold", 3.0)]
    listed = httpx.get(url, headers=h).json()["weights"]
    assert [(w["tenant"], w["weight"]) for w in listed] == [(None, 2.0), ("gold", 3.0)]
    assert httpx.delete(url, params={"tenant": "gold"}, headers=h).status_code == 204
    assert httpx.delete(url, params={"tenant": "gold"}, headers=h).status_code == 404
    assert served.q.weights() == [TenantWeight("a", None, 2.0)]


def test_a_bad_weight_is_a_clear_400_and_stores_nothing(served: Served) -> None:
    url = served.url + "/v1/apps/a/weights"
    h = _h(served.a_all)
    for bad in (0, -1, 1e9):
        r = httpx.put(url, json={"tenant": "t", "weight": bad}, headers=h)
        assert r.status_code == 400 and "weight" in r.json()["detail"], r.text
    r = httpx.put(url, content=b'{"tenant": "t", "weight": NaN}', headers=h)
    assert r.status_code in (400, 422), r.text
    assert httpx.put(url, json={"tenant": "", "weight": 2}, headers=h).status_code == 400
    assert served.q.weights() == []


def test_weight_routes_need_the_admin_role_for_the_app(served: Served) -> None:
    url = served.url + "/v1/apps/a/weights"
    for token, status in ((served.a_produce, 403), (served.b_all, 403), ("nope", 401)):
        h = _h(token)
        assert httpx.put(url, json={"tenant": "t", "weight": 2}, headers=h).status_code == status
        assert httpx.get(url, headers=h).status_code == status
        assert httpx.delete(url, params={"tenant": "t"}, headers=h).status_code == status
    assert served.q.weights() == []


def test_tenant_limits_are_set_listed_and_cleared_by_an_admin(served: Served) -> None:
    url = served.url + "/v1/apps/a/tenant-limits"
    h = _h(served.a_all)
    body = {"tenant": "t", "max_running": 2, "rate": 10, "per_s": 1}
    r = httpx.put(url, json=body, headers=h)
    assert r.status_code == 200, r.text
    assert r.json() == {"app": "a", "tenant": "t", "job_type": None, "max_running": 2,
                        "rate": 10, "per_s": 1.0}  # fmt: skip
    assert served.q.tenant_limits() == [TenantLimit("a", "t", None, 2, 10, 1.0)]
    assert [x["tenant"] for x in httpx.get(url, headers=h).json()["limits"]] == ["t"]
    assert httpx.delete(url, params={"tenant": "t"}, headers=h).status_code == 204
    assert httpx.delete(url, params={"tenant": "t"}, headers=h).status_code == 404
    assert served.q.tenant_limits() == []


def test_a_bad_tenant_limit_is_a_clear_400_and_stores_nothing(served: Served) -> None:
    url = served.url + "/v1/apps/a/tenant-limits"
    h = _h(served.a_all)
    for bad in ({"tenant": "t", "max_running": 0}, {"tenant": "t"},
                {"tenant": "t", "rate": 5, "per_s": 0}, {"tenant": "", "rate": 5}):  # fmt: skip
        r = httpx.put(url, json=bad, headers=h)
        assert r.status_code == 400, (bad, r.text)
    producer = _h(served.a_produce)
    assert httpx.put(url, json={"tenant": "t", "rate": 1}, headers=producer).status_code == 403
    assert served.q.tenant_limits() == []


def test_the_python_client_sets_and_lists_weights_and_limits(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        assert rq.set_weight("a", "gold", 3)["weight"] == 3.0
        assert [w["tenant"] for w in rq.weights("a")] == ["gold"]
        rq.set_tenant_limit("a", "t", max_running=2)
        assert [x["max_running"] for x in rq.tenant_limits("a")] == [2]
        try:
            rq.set_weight("a", "gold", 0)
        except RemoteError as err:
            assert err.status == 400
        else:
            raise AssertionError("a weight of 0 was stored")
    assert served.q.weights() == [TenantWeight("a", "gold", 3.0)]


def test_clearing_a_setting_not_stored_is_a_404_that_names_it(served: Served) -> None:
    """The weight, tenant limit and pause DELETEs answer alike: 204 when it was stored,
    then a 404 whose code and detail name what is not there."""
    h = _h(served.a_all)
    base = served.url + "/v1/apps/a/"
    served.q.set_weight("a", "gold", 2)
    served.q.set_tenant_limit("a", "t", "mail", max_running=1)
    served.q.pause("a", "t")
    for path, params, code, detail in (
        ("weights", {"tenant": "gold"}, "no_weight", "app=a tenant=gold has no weight"),
        ("tenant-limits", {"tenant": "t", "job_type": "mail"}, "no_limit",
         "app=a tenant=t has no such limit"),
        ("pauses", {"tenant": "t"}, "not_paused", "app=a tenant=t is not paused"),
    ):  # fmt: skip
        first = httpx.delete(base + path, params=params, headers=h)
        assert (first.status_code, first.content) == (204, b""), path
        again = httpx.delete(base + path, params=params, headers=h)
        assert again.status_code == 404, path
        assert (again.json()["error"], again.json()["detail"]) == (code, detail)
    assert (served.q.weights(), served.q.tenant_limits(), served.q.paused()) == ([], [], [])

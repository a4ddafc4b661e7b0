"""Named limits through ``quick serve`` (issue 45 point 2): ``/v1/apps/{app}/limits`` and
``/v1/apps/{app}/limits/{name}``, admin role for the route's app; what they store every
consumer enforces within about a second."""

from __future__ import annotations

import httpx

from quickzones.store.named_limits import Limit

from .conftest import Served


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_limit_is_put_read_listed_and_deleted_by_an_admin(served: Served) -> None:
    base = served.url + "/v1/apps/a/limits"
    h = _h(served.a_all)
    r = httpx.put(base + "/emails", json={"concurrency": 5, "per_tenant": 2}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json() == {"app": "a", "name": "emails", "concurrency": 5, "per_tenant": 2,
                        "rate": None, "per_s": 1.0}  # fmt: skip
    assert served.q.get_limit("a", "emails") == Limit("a", "emails", 5, 2)
    r = httpx.put(base + "/emails", json={"concurrency": 3}, headers=h)  # replaced
    assert r.status_code == 200 and served.q.get_limit("a", "emails") == Limit("a", "emails", 3)
    assert httpx.put(base + "/sms", json={"rate": 10, "per_s": 60}, headers=h).status_code == 200
    assert httpx.get(base + "/emails", headers=h).json()["concurrency"] == 3
    assert [x["name"] for x in httpx.get(base, headers=h).json()["limits"]] == ["emails", "sms"]
    assert httpx.delete(base + "/emails", headers=h).status_code == 204
    r = httpx.delete(base + "/emails", headers=h)
    assert r.status_code == 404 and "emails" in r.json()["detail"]
    r = httpx.get(base + "/emails", headers=h)
    assert r.status_code == 404 and "emails" in r.json()["detail"]
    assert served.q.list_limits() == [Limit("a", "sms", None, None, 10, 60.0)]


def test_a_bad_limit_is_a_clear_400_and_stores_nothing(served: Served) -> None:
    url = served.url + "/v1/apps/a/limits/emails"
    h = _h(served.a_all)
    for bad in ({"concurrency": 0}, {"concurrency": -1}, {}, {"rate": 5, "per_s": 0},
                {"concurrency": 2, "per_tenant": 3}):  # fmt: skip
        r = httpx.put(url, json=bad, headers=h)
        assert r.status_code == 400, (bad, r.text)
    r = httpx.put(url, json={"concurrency": 1, "nope": 1}, headers=h)
    assert r.status_code in (400, 422), r.text
    assert served.q.list_limits() == []


def test_limit_routes_need_the_admin_role_for_the_app(served: Served) -> None:
    url = served.url + "/v1/apps/a/limits/emails"
    for token, status in ((served.a_produce, 403), (served.b_all, 403), ("nope", 401)):
        h = _h(token)
        assert httpx.put(url, json={"concurrency": 2}, headers=h).status_code == status
        assert httpx.get(url, headers=h).status_code == status
        assert httpx.get(served.url + "/v1/apps/a/limits", headers=h).status_code == status
        assert httpx.delete(url, headers=h).status_code == status
    assert served.q.list_limits() == []

"""Issue 28, point 2: a payload the API could not send back is refused at enqueue (the
Python API and HTTP alike), and a lease response never fails as a whole because of one
item: an item stored before that rule whose payload cannot be sent is dead-lettered with
the reason, and the others are delivered."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from quickzones.adapters.http.client import RemoteQuick
from quickzones.errors import InvalidArgument
from quickzones.store.enqueue import enqueue
from quickzones.store.records import ZoneId
from quickzones.store.zonestore import NewItem

from .conftest import Served


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# What an attacker sends: each is valid JSON on the wire, and each broke the lease route.
UNSENDABLE: list[tuple[str, Any, str]] = [
    ("lone surrogate", "\ud800", "surrogate"),
    ("lone surrogate in a key", {"k\udfff": 1}, "surrogate"),
    ("nested 300 deep", _nested(300), "nested"),
]


@pytest.mark.parametrize(("name", "payload", "why"), UNSENDABLE, ids=[u[0] for u in UNSENDABLE])
def test_a_payload_the_api_cannot_send_back_is_refused_at_enqueue(
    served: Served, name: str, payload: Any, why: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        served.q.enqueue("job", payload, app="a", tenant="t")
    assert why in str(err.value), err.value
    h = {"Authorization": f"Bearer {served.a_all}", "Content-Type": "application/json"}
    # As JSON's ASCII escapes ("\ud800"): how any client can send a lone surrogate.
    one = json.dumps({"job_type": "job", "payload": payload})
    r = httpx.post(served.url + "/v1/apps/a/tenants/t/items", content=one, headers=h)
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert r.json()["error"] == "invalid_argument" and why in r.json()["detail"]
    many = json.dumps({"job_type": "job", "items": [{"payload": 1}, {"payload": payload}]})
    r = httpx.post(served.url + "/v1/apps/a/tenants/t/batches", content=many, headers=h)
    assert r.status_code == 400 and why in r.json()["detail"], r.text[:200]
    assert served.q.run_until_idle() == 0, "a refused payload was stored"
    # What the API can send back still goes through, up to the depth limit.
    ok = served.q.enqueue("job", _nested(100), app="a", tenant="t")
    with RemoteQuick(served.url, served.a_all) as rq:
        [got] = rq.lease(wait_s=2)
        assert got.item_id == ok and got.payload == _nested(100)


def test_one_unsendable_item_never_fails_a_lease(served: Served) -> None:
    # Items as a version without the enqueue check stored them.
    q = served.q
    bad = []
    for n, body in enumerate([b'"\\ud800"', b"[" * 300 + b"]" * 300, b"{not json"]):
        zone = ZoneId("a", f"bad{n}")
        bad.append(enqueue(q.kv, q.toplevel, q.items, zone,
                           NewItem("job", body, content_type="json")))  # fmt: skip
    good = {q.enqueue("job", {"n": n}, app="a", tenant=f"good{n}") for n in range(3)}
    with RemoteQuick(served.url, served.a_all) as rq:
        leased = []
        for _ in range(10):
            leased += rq.lease(max_items=10, wait_s=1)
            if len(leased) >= 3:
                break
        assert {x.item_id for x in leased} == good
        for x in leased:
            rq.complete(x)
        assert rq.lease(max_items=10, wait_s=0.2) == []
    letters = {d.item_id: d.reason for d in q.dead_letters("a")}
    assert set(letters) == set(bad), letters
    assert all("cannot be sent" in reason for reason in letters.values()), letters

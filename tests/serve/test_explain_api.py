"""``GET .../items/{id}/explain`` through ``quick serve`` (issue 45 point 3): the same
explanation as ``quick explain``, for the producer role of the item's app."""

from __future__ import annotations

import httpx

from .conftest import Served


def test_explain_names_the_first_rule_holding_the_item(served: Served) -> None:
    q = served.q
    item = q.enqueue("job", b"", app="a", tenant="t", delay=600)
    q.pause(app="a", tenant="t")
    url = f"{served.url}/v1/apps/a/tenants/t/items/{item}/explain"
    got = httpx.get(url, headers={"Authorization": f"Bearer {served.a_produce}"})
    assert got.status_code == 200, got.text
    doc = got.json()
    assert doc["state"] == "queued" and doc["item_id"] == item
    held = [r["name"] for r in doc["rules"] if r["holds"]]
    assert held[0] == doc["first"]
    assert {"vesting", "paused"} <= set(held)
    vesting = next(r for r in doc["rules"] if r["name"] == "vesting")
    assert vesting["until_ms"] == q.get("a", "t", item).vesting_ms  # type: ignore[union-attr]
    gone = httpx.get(
        url.replace(item, "nope"), headers={"Authorization": f"Bearer {served.a_produce}"}
    )
    assert gone.status_code == 200 and gone.json()["state"] == "absent"


def test_explain_needs_a_token_for_the_app(served: Served) -> None:
    item = served.q.enqueue("job", b"", app="a", tenant="t")
    url = f"{served.url}/v1/apps/a/tenants/t/items/{item}/explain"
    for token, status in ((served.b_all, 403), ("nope", 401)):
        assert httpx.get(url, headers={"Authorization": f"Bearer {token}"}).status_code == status

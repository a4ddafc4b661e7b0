"""Every dashboard control that changes data (dead letters' requeue and purge, pauses,
tenant weights, named limits) passes the same guard, in the same order: signed in, the
session's CSRF token, a token for the app, the admin role, then the confirmation page's
"yes"; a POST refused at any step changes nothing, and the same POST confirmed does what
it says."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.registry import RetryPolicy

from .conftest import ServerThread

# (path, form, what the store holds: untouched before, changed after a confirmed POST)
CONTROLS: dict[str, tuple[str, dict[str, str], Callable[[Quick], Any]]] = {
    "dead-letter purge": (
        "/apps/a/dead-letters/purge",
        {"tenant": "t"},
        lambda q: len(q.dead_letters(app="a")),
    ),
    "pause": ("/apps/a/pauses/pause", {"tenant": "t"}, lambda q: q.paused()),
    "limit set": (
        "/apps/a/limits/set",
        {"name": "emails", "concurrency": "3"},
        lambda q: q.list_limits("a"),
    ),
    "limit remove": ("/apps/a/limits/remove", {"name": "emails"}, lambda q: q.list_limits("a")),
    "weight": (
        "/apps/a/weights/set",
        {"tenant": "t", "weight": "3"},
        lambda q: [(w.tenant, w.weight) for w in q.weights()],
    ),
}


def _signed_in(url: str, token: str) -> tuple[httpx.Client, str]:
    """A client with the session cookie of ``token`` and the CSRF token its pages carry."""
    client = httpx.Client(base_url=url)
    assert client.post("/login", data={"token": token}).status_code == 303
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/").text)
    assert csrf is not None
    return client, csrf[1]


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_each_control_is_refused_by_one_guard_and_changes_nothing(control: str) -> None:
    path, form, held = CONTROLS[control]
    q = Quick.open("memory://")

    @q.job("fails", retry=RetryPolicy(max_attempts=1))
    def fails(payload: Any, ctx: Any) -> None:
        raise ValueError("boom")

    q.enqueue("fails", 1, app="a", tenant="t")
    q.run_until_idle()
    q.set_limit("a", "emails", concurrency=5)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    admin_a = tokens.create("a", ["admin"])[0]
    admin_b = tokens.create("b", ["admin"])[0]
    viewer_a = tokens.create("a", ["view"])[0]
    before = held(q)
    try:
        with ServerThread(create_app(q)) as server:
            anonymous = httpx.post(server.url + path, data={**form, "confirm": "yes"})
            assert anonymous.status_code == 401
            admin, csrf = _signed_in(server.url, admin_a)
            forged = admin.post(path, data={**form, "confirm": "yes", "csrf": "0" * 64})
            assert forged.status_code == 403 and forged.json()["error"] == "csrf"
            for token in (admin_b, viewer_a):  # another app's admin, a view token
                other, other_csrf = _signed_in(server.url, token)
                refused = other.post(path, data={**form, "confirm": "yes", "csrf": other_csrf})
                assert refused.status_code == 403 and "<html" in refused.text.lower()
            unconfirmed = admin.post(path, data={**form, "csrf": csrf})
            assert unconfirmed.status_code == 400
            assert unconfirmed.json()["detail"] == "confirm the action on its confirmation page"
            assert held(q) == before, "a refused control changed nothing"

            done = admin.post(path, data={**form, "confirm": "yes", "csrf": csrf})
            assert done.status_code == 303 and "done=" in done.headers["location"]
            assert held(q) != before
    finally:
        q.close()

"""The dashboard's limits page changes named limits (issue 45 point 2: "can change at run
time (CLI, API, dashboard)"): an admin of the app sets a limit's concurrency, per-tenant
share and rate, declares one or removes one, through the confirmation page and a POST
with the session's CSRF token, as every other control; the page calls the store function
the API and ``quick limits`` call, so a running consumer obeys the new value within about
a second. Bad input is an error on the page and changes nothing; a view token sees no
form and is refused. Over HTTP with a real server; the browser's run (and its
screenshot) is test_dashboard_limits_browser.py's. Before, the page only showed them."""

from __future__ import annotations

import html as html_lib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.store.named_limits import Limit
from tests.conftest import HAVE_FDB, HAVE_POSTGRES, store_url
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for

from .conftest import ServerThread, signed_in

HANDLER_S = 0.2


@pytest.fixture
def q() -> Iterator[Quick]:
    quick = Quick.open("memory://")
    try:
        yield quick
    finally:
        quick.close()


def _hidden(page: str) -> dict[str, str]:
    """The hidden fields of the confirmation page's form: what its "yes" posts."""
    found = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page)
    return {k: html_lib.unescape(v) for k, v in found}


def _confirmed(client: httpx.Client, app: str, params: dict[str, str]) -> httpx.Response:
    """What a click on the form's button and then on the confirmation page's "yes" does:
    the confirmation page asked for with the form's fields, its form posted."""
    asked = client.get(f"/apps/{app}/limits/confirm", params=params)
    assert asked.status_code == 200, asked.text
    fields = _hidden(asked.text)
    return client.post(_action(asked.text), data=fields)


def _action(page: str) -> str:
    """Where the confirmation page's form posts (not the header's sign-out form)."""
    found = re.search(r'<form method="post" action="(/apps/[^"]+/limits/[a-z]+)"', page)
    assert found is not None, page
    return html_lib.unescape(found[1])


def _error(page: str) -> str:
    found = re.search(r'<p class="error" role="alert" id="error">(.*?)</p>', page, re.S)
    assert found is not None, page
    return html_lib.unescape(found[1])


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        *(["postgres"] if HAVE_POSTGRES else []),
        *([pytest.param("fdb", marks=pytest.mark.fdb)] if HAVE_FDB else []),
    ],
)
def test_a_limit_changed_on_the_page_is_obeyed_by_a_running_consumer_within_a_second(
    backend: str, tmp_path: Path
) -> None:
    """The server and the consumer each open the store (as two processes would): the
    consumer learns of the change only from the store, within its 1 s refresh."""
    url = store_url(backend, tmp_path)
    q, worker = Quick.open(url), Quick.open(url)
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def send(payload: Any, ctx: Any) -> None:
        start = time.time()
        time.sleep(HANDLER_S)
        with lock:
            spans.append((start, time.time()))

    def seen() -> list[tuple[float, float]]:
        with lock:
            return list(spans)

    worker.job("send", limits=["emails"])(send)
    q.set_limit("shop", "emails", concurrency=4)
    for t in range(4):
        q.enqueue_many("send", list(range(100)), app="shop", tenant=f"t{t}")
    operator = TokenStore(q.kv, q.keys, q.clock).create("shop", ["admin"])[0]
    consumer = worker.consumer(ConsumerConfig(workers=8, idle_sleep_s=0.05), name="c1")
    try:
        with ServerThread(create_app(q)) as server:
            consumer.start()
            assert wait_for(lambda: most_at_once(seen()) >= 4, 120)
            client = signed_in(server.url, operator)
            before = time.time()
            done = _confirmed(
                client, "shop", {"action": "set", "name": "emails", "concurrency": "2",
                                 "per_tenant": "", "rate": ""},
            )  # fmt: skip
            changed = time.time()  # committed by now
            assert done.status_code == 303, done.text
            assert q.get_limit("shop", "emails") == Limit("shop", "emails", 2)
            # Within a second (the consumers' refresh) plus the runs started before it.
            settled = changed + 1.0 + HANDLER_S
            assert wait_for(lambda: sum(s > settled for s, _ in seen()) >= 15, 120)
            client.close()
    finally:
        consumer.stop()
        q.close()
        worker.close()
    assert most_at_once([s for s in spans if s[1] < before]) == 4
    assert most_at_once([s for s in spans if s[0] > settled]) == 2


def test_an_admin_sets_declares_and_removes_limits_from_the_page(q: Quick) -> None:
    q.set_limit("shop", "emails", concurrency=5, per_tenant=2)
    admin = TokenStore(q.kv, q.keys, q.clock).create("shop", ["admin"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, admin)
        page = client.get("/apps/shop/limits").text
        assert 'id="set-limit"' in page  # the form, declaring a limit by default
        assert 'href="/apps/shop/limits?edit=emails#set-limit"' in page
        # "change…" fills the form with the limit as it is, to change what it should.
        edit = client.get("/apps/shop/limits", params={"edit": "emails"}).text
        form = edit.split('id="set-limit"')[1].split("</form>")[0]
        assert 'name="concurrency" value="5"' in form and 'name="per_tenant" value="2"' in form
        assert 'name="name" value="emails"' in form and 'name="new"' not in form
        # A period set through the API keeps every digit in the form (not 12345.7).
        q.set_limit("shop", "sms", rate=5, per=12345.67)
        edit = client.get("/apps/shop/limits", params={"edit": "sms"}).text
        assert 'name="rate" value="5/12345.67s"' in edit
        q.delete_limit("shop", "sms")
        asked = client.get(
            "/apps/shop/limits/confirm",
            params={"action": "set", "name": "emails", "concurrency": "3", "per_tenant": "1",
                    "rate": "600/h"},
        )  # fmt: skip
        assert asked.status_code == 200
        # The confirmation page says what the limit is and what it becomes.
        assert "app=shop limit=emails concurrency=5 per_tenant=2" in asked.text
        assert "app=shop limit=emails concurrency=3 per_tenant=1 rate=600/3600s" in asked.text
        assert q.get_limit("shop", "emails") == Limit("shop", "emails", 5, 2)  # not yet
        done = client.post(_action(asked.text), data=_hidden(asked.text))
        assert done.status_code == 303 and "done=" in done.headers["location"]
        assert q.get_limit("shop", "emails") == Limit("shop", "emails", 3, 1, 600, 3600.0)
        after = client.get(done.headers["location"]).text
        assert re.search(r'id="done">set app=shop limit=emails concurrency=3', after)
        row = after.split('data-limit="emails"')[1].split("</tr>")[0]
        assert "<td>3</td>" in row and "600 per 3600 s" in row

        # A new limit, from the form's name field; the rate in the page's syntax.
        done = _confirmed(
            client, "shop", {"action": "set", "new": "yes", "name": "sms", "rate": "10/60s"}
        )
        assert done.status_code == 303
        assert q.get_limit("shop", "sms") == Limit("shop", "sms", None, None, 10, 60.0)
        for rate, stored in (("5", (5, 1.0)), ("5/s", (5, 1.0)), ("2 / 0.5s", (2, 0.5)),
                             ("30/min", (30, 60.0)), ("1/2h", (1, 7200.0))):  # fmt: skip
            fields = {"action": "set", "name": "sms", "rate": rate}
            assert _confirmed(client, "shop", fields).status_code == 303
            got = q.get_limit("shop", "sms")
            assert got is not None and (got.rate, got.per_s) == stored, rate

        # Remove: its own confirmation page, then gone for every consumer.
        asked = client.get("/apps/shop/limits/confirm", params={"action": "remove", "name": "sms"})
        assert asked.status_code == 200 and "app=shop limit=sms" in asked.text
        done = _confirmed(client, "shop", {"action": "remove", "name": "sms"})
        assert done.status_code == 303 and q.get_limit("shop", "sms") is None
        assert "removed limit sms" in client.get(done.headers["location"]).text
        client.close()


# (the form's fields, what the error must name)
BAD: dict[str, tuple[dict[str, str], str]] = {
    "negative": ({"name": "emails", "concurrency": "-1"}, "invalid concurrency -1"),
    "zero": ({"name": "emails", "per_tenant": "0"}, "invalid per_tenant 0"),
    "non-numeric": ({"name": "emails", "concurrency": "five"}, "invalid concurrency 'five'"),
    "decimal": ({"name": "emails", "concurrency": "2.5"}, "invalid concurrency '2.5'"),
    "rate syntax": ({"name": "emails", "rate": "10 per minute"}, "invalid rate '10 per minute'"),
    "rate unit": ({"name": "emails", "rate": "10/60 fortnights"}, "invalid rate"),
    "rate period zero": ({"name": "emails", "rate": "10/0s"}, "invalid per 0.0"),
    "nothing given": ({"name": "emails"}, "give concurrency, per_tenant, rate"),
    "share over total": (
        {"name": "emails", "concurrency": "2", "per_tenant": "3"},
        "must not exceed concurrency",
    ),
    "unknown limit": ({"name": "nope", "concurrency": "2"}, "app shop has no limit 'nope'"),
    "declared twice": (
        {"name": "emails", "new": "yes", "concurrency": "2"},
        "app shop has limit 'emails' already",
    ),
    "bad name": ({"name": "", "new": "yes", "concurrency": "2"}, "invalid limit name"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_error_on_the_page_and_changes_nothing(q: Quick, case: str) -> None:
    fields, says = BAD[case]
    q.set_limit("shop", "emails", concurrency=5, per_tenant=2)
    before = q.list_limits()
    admin = TokenStore(q.kv, q.keys, q.clock).create("shop", ["admin"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, admin)
        csrf = _hidden(client.get("/apps/shop/limits").text)["csrf"]
        asked = client.get("/apps/shop/limits/confirm", params={"action": "set", **fields})
        assert asked.status_code == 400
        assert says in _error(asked.text), _error(asked.text)
        # The page again, with the form as it was filled in to correct it.
        assert 'id="set-limit"' in asked.text and 'id="limits"' in asked.text
        for value in fields.values():
            if value not in ("", "yes"):
                assert f'value="{html_lib.escape(value)}"' in asked.text
        # The same fields posted past the confirmation page: refused the same way.
        posted = client.post(
            "/apps/shop/limits/set", data={**fields, "csrf": csrf, "confirm": "yes"}
        )
        assert posted.status_code == 400 and says in _error(posted.text)
        assert q.list_limits() == before
        client.close()


def test_removing_an_unknown_limit_is_an_error_on_the_page(q: Quick) -> None:
    q.set_limit("shop", "emails", concurrency=5)
    admin = TokenStore(q.kv, q.keys, q.clock).create("shop", ["admin"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, admin)
        csrf = _hidden(client.get("/apps/shop/limits").text)["csrf"]
        asked = client.get("/apps/shop/limits/confirm", params={"action": "remove", "name": "sms"})
        assert asked.status_code == 400 and "app shop has no limit 'sms'" in _error(asked.text)
        posted = client.post(
            "/apps/shop/limits/remove", data={"name": "sms", "csrf": csrf, "confirm": "yes"}
        )
        assert posted.status_code == 400 and "no limit 'sms'" in _error(posted.text)
        asked = client.get("/apps/shop/limits/confirm", params={"action": "drop", "name": "x"})
        assert asked.status_code == 400 and "unknown action 'drop'" in _error(asked.text)
        edit = client.get("/apps/shop/limits", params={"edit": "sms"})
        assert edit.status_code == 400 and "no limit 'sms'" in _error(edit.text)
        assert q.list_limits() == [Limit("shop", "emails", 5)]
        client.close()


def test_a_view_token_sees_no_form_and_is_refused(q: Quick) -> None:
    q.set_limit("shop", "emails", concurrency=5)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    viewer = tokens.create("shop", ["view"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, viewer)
        page = client.get("/apps/shop/limits")
        assert page.status_code == 200 and 'data-limit="emails"' in page.text
        assert 'id="set-limit"' not in page.text and "change…" not in page.text
        assert "remove…" not in page.text
        csrf = _hidden(page.text)["csrf"]  # the sign-out form's: a valid token of its own
        for action, fields in (("set", {"name": "emails", "concurrency": "1"}),
                               ("remove", {"name": "emails"})):  # fmt: skip
            asked = client.get("/apps/shop/limits/confirm", params={"action": action, **fields})
            assert asked.status_code == 403
            posted = client.post(
                f"/apps/shop/limits/{action}", data={**fields, "csrf": csrf, "confirm": "yes"}
            )
            assert posted.status_code == 403 and "may view, not act" in posted.text
        assert q.list_limits() == [Limit("shop", "emails", 5)]
        client.close()

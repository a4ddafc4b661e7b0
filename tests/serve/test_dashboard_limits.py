"""The dashboard shows named limits (issue 45 point 2): an app's limits (concurrency, per
tenant, rate) with the slots held now and by whom, local consumers and ``quick serve``
(for its remote workers' runs) alike; the holders paged, never every tenant's read at
once. Over HTTP with a real server and a real consumer; the screenshot in headless
Chromium is test_dashboard_limits_browser.py's. Before, the dashboard had no limits page
(404)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteQuick
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from tests.waiting import wait_for

from .conftest import ServerThread, signed_in

EMAILS = {"bounce_notice": {"limits": ["emails"], "cost": 1}}


@pytest.fixture(params=["memory", "sqlite"])
def q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quick]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'q.db'}"
    quick = Quick.open(url)
    try:
        yield quick
    finally:
        quick.close()


def _rows(html: str, attr: str) -> list[str]:
    return re.findall(rf'<tr {attr}="([^"]+)"', html)


def test_the_limits_page_shows_each_limit_and_who_holds_its_slots(q: Quick) -> None:
    release = threading.Event()
    running = {"n": 0}

    @q.job("send_receipt", limits=["emails"])
    def send_receipt(payload: Any, ctx: Any) -> None:
        running["n"] += 1
        release.wait(timeout=120)

    q.set_limit("shop", "emails", concurrency=3, per_tenant=2)
    q.set_limit("shop", "sms", rate=10, per=60)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    operator = tokens.create_for_all_apps(["admin", "consume"])[0]
    for _ in range(3):
        q.enqueue("send_receipt", {}, app="shop", tenant="acme")
    # The local consumer runs receipts; the remote worker's job type is its own.
    consumer = q.consumer(ConsumerConfig(workers=4, job_types=("send_receipt",)), name="consumer-1")
    consumer.start()
    try:
        assert wait_for(lambda: running["n"] == 2)  # acme's share of 2 is full
        with ServerThread(create_app(q)) as server:
            # A remote worker's run, held by quick serve from its lease to its outcome.
            q.enqueue("bounce_notice", {}, app="shop", tenant="globex")
            with RemoteQuick(server.url, operator) as remote:
                leased = remote.lease(
                    1, wait_s=5.0, lease_s=60.0, job_types=["bounce_notice"], named_limits=EMAILS
                )
                assert [x.tenant for x in leased] == ["globex"]
                client = signed_in(server.url, operator)
                html = client.get("/apps/shop/limits").text
                assert _rows(html, "data-limit") == ["emails", "sms"]
                emails = html.split('data-limit="emails"')[1].split("</tr>")[0]
                assert "3 of 3" in emails and "full" in emails
                assert "consumer-1: 2" in emails and re.search(r"serve-[0-9a-f]+: 1", emails)
                sms = html.split('data-limit="sms"')[1].split("</tr>")[0]
                assert "10 per 60 s" in sms and "nobody" in sms
                held = _rows(html, "data-holding")
                assert "emails//consumer-1" in held and "emails/acme/consumer-1" in held
                assert any(re.fullmatch(r"emails/globex/serve-[0-9a-f]+", h) for h in held)
                remote.complete(leased[0])
                # Its outcome frees quick serve's slots: the page says so.
                after = client.get("/apps/shop/limits").text
                assert not any("serve-" in h for h in _rows(after, "data-holding"))
                client.close()
    finally:
        release.set()
        consumer.stop()


def test_the_holders_are_paged(q: Quick) -> None:
    """Slots held by 120 tenants: 50 a page, each read from the last page's cursor."""
    q.set_limit("a", "emails", concurrency=1000, per_tenant=1)
    for n in range(120):
        q.limits.acquire_slots("limit", ("a", "emails", f"t{n:03}"), "c1", 1, 1, 600_000)
    operator = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, operator)
        seen: list[str] = []
        url = "/apps/a/limits"
        for _ in range(5):
            html = client.get(url).text
            page = _rows(html, "data-holding")
            assert len(page) <= 50
            seen += page
            found = re.search(r'href="\?cursor=([^"]+)" id="next-page"', html)
            if found is None:
                break
            url = "/apps/a/limits?cursor=" + found[1]
        assert seen == [f"emails/t{n:03}/c1" for n in range(120)]
        bad = client.get("/apps/a/limits?cursor=zz")
        assert bad.status_code == 400 and "cursor" in bad.text
        other = client.get("/apps/a/limits?cursor=" + "00" * 8)
        assert other.status_code == 400
        client.close()


def test_a_token_of_another_app_sees_no_limits(q: Quick) -> None:
    q.set_limit("shop", "emails", concurrency=3)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    other = tokens.create("other", ["admin"])[0]
    with ServerThread(create_app(q)) as server:
        client = signed_in(server.url, other)
        answer = client.get("/apps/shop/limits")
        assert answer.status_code == 403 and "emails" not in answer.text
        client.close()

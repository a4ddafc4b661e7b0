"""The dashboard's named limits page in headless Chromium (issue 45 point 2): a limit
held full by a local consumer and by ``quick serve`` for a remote worker's run, reached
from the app page; the screenshot kept in ``docs/img/serve-limits.png``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteQuick
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.store.named_limits import Limit
from tests.waiting import wait_for

from .browser import require_chromium, screenshot_path
from .conftest import ServerThread

require_chromium()
sync_api = pytest.importorskip("playwright.sync_api")
BOUNCES = {"bounce_notice": {"limits": ["emails"], "cost": 1}}


def test_the_limits_page_in_a_browser(tmp_path: Path, browser: Any) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'dash.db'}")
    release = threading.Event()
    running = {"n": 0}

    @q.job("send_receipt", limits=["emails"])
    def send_receipt(payload: Any, ctx: Any) -> None:
        running["n"] += 1
        release.wait(timeout=120)

    @q.job("send_digest", limits=["emails"], cost=2)
    def send_digest(payload: Any, ctx: Any) -> None:
        running["n"] += 1
        release.wait(timeout=120)

    q.set_limit("shop", "emails", concurrency=5, per_tenant=2)
    q.set_limit("shop", "sms", rate=10, per=60)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    operator = tokens.create_for_all_apps(["admin", "consume"])[0]
    q.enqueue("send_digest", {}, app="shop", tenant="acme")
    consumer = q.consumer(
        ConsumerConfig(workers=4, job_types=("send_receipt", "send_digest")), name="consumer-1"
    )
    consumer.start()
    try:
        # acme's digest first (2 slots: its share), so acme's receipt waits whichever of
        # the two a worker would start first; then globex's and initech's: 4 of 5.
        assert wait_for(lambda: running["n"] == 1)
        for tenant in ("acme", "globex", "initech"):
            q.enqueue("send_receipt", {}, app="shop", tenant=tenant)
        assert wait_for(lambda: running["n"] == 3)
        with ServerThread(create_app(q)) as server, RemoteQuick(server.url, operator) as remote:
            q.enqueue("bounce_notice", {}, app="shop", tenant="umbrella")
            leased = remote.lease(
                1, wait_s=5.0, lease_s=60.0, job_types=["bounce_notice"], named_limits=BOUNCES
            )
            assert [x.tenant for x in leased] == ["umbrella"]  # the fifth slot
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            try:
                page.goto(server.url + "/login")
                page.fill("#token", operator)
                page.click("#sign-in")
                page.wait_for_selector("h1:has-text('Overview')")
                page.goto(server.url + "/apps/shop")
                page.click("main >> text=Limits")
                page.wait_for_selector("h1:has-text('Limits of shop')")
                emails = page.locator("tr[data-limit=emails]")
                sync_api.expect(emails.locator("td[data-col=held]")).to_contain_text("5 of 5")
                holders = emails.locator("td[data-col=holders]").inner_text()
                assert "consumer-1: 4" in holders and "serve-" in holders
                held = page.locator("#held tr[data-holding]")
                sync_api.expect(held).to_have_count(6)  # 2 holders of the total, 4 shares
                page.screenshot(path=str(screenshot_path("serve-limits.png")), full_page=True)
            finally:
                page.close()
            remote.complete(leased[0])
    finally:
        release.set()
        consumer.stop()
        q.close()


def test_a_limit_changed_through_the_form_in_a_browser(tmp_path: Path, browser: Any) -> None:
    """An admin changes a limit from its row's "change…", confirms, and sees it changed;
    a bad rate typed in the form is an error on the page. The screenshot, of the filled
    form, is kept in ``docs/img/serve-limits-edit.png``."""
    q = Quick.open(f"sqlite:///{tmp_path / 'dash.db'}")
    q.set_limit("shop", "emails", concurrency=5, per_tenant=2)
    q.set_limit("shop", "sms", rate=10, per=60)
    # Slots held now, as running consumers hold them: the total's and tenants' shares.
    for tenant, n in (("acme", 2), ("globex", 1)):
        q.limits.acquire_slots("limit", ("shop", "emails", ""), "consumer-1", n, 5, 600_000)
        q.limits.acquire_slots("limit", ("shop", "emails", tenant), "consumer-1", n, 2, 600_000)
    operator = TokenStore(q.kv, q.keys, q.clock).create("shop", ["admin"])[0]
    try:
        with ServerThread(create_app(q)) as server:
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            try:
                page.goto(server.url + "/login")
                page.fill("#token", operator)
                page.click("#sign-in")
                page.wait_for_selector("h1:has-text('Overview')")
                page.goto(server.url + "/apps/shop/limits")
                page.locator("tr[data-limit=emails] >> text=change…").click()
                page.wait_for_selector("h2:has-text('Change limit emails')")
                form = page.locator("#set-limit")
                assert form.locator("input[name=concurrency]").input_value() == "5"
                assert form.locator("input[name=per_tenant]").input_value() == "2"
                form.locator("input[name=concurrency]").fill("3")
                form.locator("input[name=rate]").fill("600/h")
                page.screenshot(path=str(screenshot_path("serve-limits-edit.png")), full_page=True)
                page.click("#set-limit-button")
                page.wait_for_selector("h1:has-text('Change limit emails of shop?')")
                page.click("#confirm")
                sync_api.expect(page.locator("#done")).to_contain_text(
                    "set app=shop limit=emails concurrency=3 per_tenant=2 rate=600/3600s"
                )
                emails = page.locator("tr[data-limit=emails]")
                sync_api.expect(emails.locator("td[data-col=held]")).to_contain_text("3 of 3")
                assert q.get_limit("shop", "emails") == Limit("shop", "emails", 3, 2, 600, 3600.0)

                form = page.locator("#set-limit")  # back to declaring a limit
                form.locator("input[name=name]").fill("push")
                form.locator("input[name=rate]").fill("ten a minute")
                page.click("#set-limit-button")
                sync_api.expect(page.locator("#error")).to_contain_text("invalid rate")
                assert page.locator("#set-limit input[name=rate]").input_value() == "ten a minute"
                assert [x.name for x in q.list_limits("shop")] == ["emails", "sms"]
            finally:
                page.close()
    finally:
        q.close()

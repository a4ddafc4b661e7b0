"""The dashboard's "what is stuck" pages in headless Chromium (issue 45 point 4): a real
consumer's running items flagged slow, its failed runs charted, its dead letters grouped
and a group requeued from a click; the screenshots kept in ``docs/img/``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.registry import RetryPolicy
from tests.waiting import wait_for

from .browser import require_chromium, screenshot_path
from .conftest import ServerThread

require_chromium()
sync_api = pytest.importorskip("playwright.sync_api")


def test_the_pages_in_a_browser(tmp_path: Path, browser: Any) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'dash.db'}")
    release = threading.Event()
    ran = {"n": 0}

    @q.job("export")
    def export(payload: Any, ctx: Any) -> None:
        if payload.get("block"):
            release.wait(timeout=120)
        ran["n"] += 1

    @q.job("email", retry=RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_cap_s=0.01))
    def email(payload: Any, ctx: Any) -> None:
        raise LookupError(f"order {payload['order']} not found")

    @q.job("sms", retry=RetryPolicy(max_attempts=1))
    def sms(payload: Any, ctx: Any) -> None:
        raise TimeoutError("gateway did not answer")

    tokens = TokenStore(q.kv, q.keys, q.clock)
    operator = tokens.create_for_all_apps(["admin"])[0]
    consumer = q.consumer(ConsumerConfig(workers=6), name="consumer-1", heartbeat_s=0.2)
    consumer.start()
    try:
        q.enqueue_many("export", [{}] * 30, app="shop", tenant="acme")
        assert wait_for(lambda: ran["n"] == 30)
        for n in range(12):
            q.enqueue("email", {"order": 1000 + n}, app="shop", tenant=f"t{n % 3}")
        for n in range(4):
            q.enqueue("sms", {"n": n}, app="shop", tenant="acme")
        for n in range(3):
            q.enqueue("export", {"block": True}, app="shop", tenant=f"big-{n}")
        assert wait_for(lambda: len(q.dead_letters(app="shop")) == 16)
        consumer.heartbeats.beat_once()  # its last failures counted in the store now
        with ServerThread(create_app(q)) as server:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                page.goto(server.url + "/login")
                page.fill("#token", operator)
                page.click("#sign-in")
                page.wait_for_selector("h1:has-text('Overview')")
                page.click("text=shop: running")
                page.wait_for_selector("h1:has-text('Running in shop')")
                sync_api.expect(page.locator("tr[data-item]")).to_have_count(3, timeout=30_000)
                sync_api.expect(page.locator("tr.slow")).to_have_count(3, timeout=30_000)
                consumers = page.locator("td[data-col=consumer]").all_inner_texts()
                assert consumers == ["consumer-1"] * 3
                page.screenshot(path=str(screenshot_path("serve-running.png")), full_page=True)

                page.click("text=shop: errors")
                page.wait_for_selector("h1:has-text('Failed runs in shop')")
                assert page.locator("svg.chart rect[data-errors]").count() >= 2
                hour = page.locator("tr[data-type=email] td[data-col=hour]")
                assert hour.inner_text() == "24"
                page.screenshot(path=str(screenshot_path("serve-errors.png")), full_page=True)

                page.click("text=Dead letters by error")
                page.wait_for_selector("h1:has-text('Dead letters of shop by error')")
                group = page.locator("tr[data-group='email: LookupError: order # not found']")
                assert group.locator("td[data-col=count]").inner_text() == "12"
                page.screenshot(
                    path=str(screenshot_path("serve-dead-letter-groups.png")), full_page=True
                )
                group.locator("[data-requeue-group]").click()
                page.wait_for_selector("h1:has-text('Requeue 12 dead letters')")
                page.click("#confirm")
                sync_api.expect(page.locator("#done")).to_contain_text("requeued 12")
            finally:
                page.close()
    finally:
        release.set()
        consumer.stop()
        q.close()

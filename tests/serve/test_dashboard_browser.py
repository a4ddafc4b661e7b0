"""The dashboard in headless Chromium (Debian's ``chromium`` driven by Playwright's pip
package; never a downloaded browser): every page loads, live figures update, and a dead
letter is followed to its requeue, after which the item runs. Screenshots are kept in
``build/artifacts/serve/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteQuick
from quickzones.client import Quick

from .browser import require_chromium, screenshot_path
from .conftest import ServerThread

require_chromium()
sync_api = pytest.importorskip("playwright.sync_api")


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(screenshot_path(f"{name}.png")), full_page=True)


def test_dashboard_pages_and_dead_letter_requeue(tmp_path: Path, browser: Any) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'dash.db'}")
    ran: list[Any] = []

    @q.job("flaky")
    def flaky(payload: Any, ctx: Any) -> None:
        ran.append(payload)

    tokens = TokenStore(q.kv, q.keys, q.clock)
    operator = tokens.create_for_all_apps(["produce", "consume", "admin"])[0]
    producer_only = tokens.create("a", ["produce"])[0]
    for n in range(12):
        q.enqueue("job", {"n": n}, app="a", tenant=f"tenant-{n:02d}")
    q.enqueue("job", 1, app="b", tenant="other", delay=600)
    try:
        with ServerThread(create_app(q)) as server:
            with RemoteQuick(server.url, operator) as rq:
                rq.enqueue("flaky", {"order": 42}, app="a", tenant="tenant-03", item_id="bad-1")
                [lease] = rq.lease(app="a", job_types=["flaky"], wait_s=2)
                rq.fail(lease, "ValueError: boom", traceback="Traceback (most recent call last):\n"
                        '  File "worker.py", line 7, in handle\nValueError: boom')  # fmt: skip

            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url + "/")
            assert "/login" in page.url
            page.fill("#token", producer_only)
            page.click("#sign-in")
            assert page.locator(".error").inner_text() == "not a valid admin or view token"
            _shot(page, "login-refused")
            page.fill("#token", operator)
            page.click("#sign-in")
            page.wait_for_selector("h1:has-text('Overview')")
            assert page.locator("[data-figure=items]").inner_text() == "13"
            assert page.locator("[data-figure=dead]").inner_text() == "1"
            _shot(page, "overview")

            # Live: the figures follow the store without a reload.
            q.enqueue_many("job", list(range(5)), app="a", tenant="tenant-00")
            sync_api.expect(page.locator("[data-figure=items]")).to_have_text("18", timeout=15_000)

            page.click("text=a: dead letters")
            page.wait_for_selector("h1:has-text('Dead letters of a')")
            page.click("summary")
            assert "ValueError: boom" in page.locator("pre").inner_text()
            _shot(page, "dead-letters")

            page.click("[data-requeue='bad-1']")
            page.wait_for_selector("h1:has-text('Requeue 1 dead letter')")
            _shot(page, "confirm-requeue")
            page.click("#confirm")
            page.wait_for_selector("#done")
            assert page.locator("#done").inner_text() == "requeued 1"
            assert "no dead letters" in page.locator("tbody").inner_text()
            _shot(page, "dead-letters-after-requeue")

            page.goto(server.url + "/apps/a")
            assert page.locator("text=12 active zones").count() == 1
            page.fill("#search", "tenant-0")
            page.press("#search", "Enter")
            page.wait_for_selector("text=10 active zones matching")
            _shot(page, "app-zones")
            page.click("text=tenant-03")
            page.wait_for_selector("h1:has-text('Zone a / tenant-03')")
            assert page.locator("text=bad-1").count() == 1
            _shot(page, "zone-items")

            page.goto(server.url + "/shards")
            page.wait_for_selector("h1:has-text('Pointers and shards')")
            _shot(page, "shards")

            page.goto(server.url + "/apps/b/dead-letters")
            assert page.locator("h1").inner_text() == "Dead letters of b"
            page.close()

        # The requeued item runs (a local consumer, same store).
        q.run_until_idle()
        assert {"order": 42} in ran
        assert q.get("a", "tenant-03", "bad-1") is None
    finally:
        q.close()


def test_dashboard_refuses_cross_site_and_other_apps(tmp_path: Path, browser: Any) -> None:
    import httpx

    q = Quick.open("memory://")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    admin_a = tokens.create("a", ["admin"])[0]
    q.enqueue("job", 1, app="b", tenant="t")
    try:
        with ServerThread(create_app(q)) as server:
            page = browser.new_page()
            page.goto(server.url + "/login")
            page.fill("#token", admin_a)
            page.click("#sign-in")
            page.wait_for_selector("h1:has-text('Overview')")
            response = page.goto(server.url + "/apps/b")
            assert response is not None and response.status == 403
            response = page.goto(server.url + "/shards")
            assert response is not None and response.status == 403
            # A POST without the page's CSRF token is refused even with the cookie.
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
            r = httpx.post(
                server.url + "/apps/a/dead-letters/purge",
                data={"confirm": "yes"},
                cookies=cookies,
            )
            assert r.status_code == 403 and r.json()["error"] == "csrf"
            page.close()
    finally:
        q.close()

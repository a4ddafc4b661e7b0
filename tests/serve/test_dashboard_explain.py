"""The item page of the dashboard in headless Chromium (issue 45 point 3): reached from
its zone's page, it shows why the item has not started, the first rule holding it named.
The screenshot is kept in ``docs/img/serve-item-explain.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.clock import now_ms
from quickzones.store import heartbeats
from quickzones.store.heartbeats import Heartbeat

from .browser import require_chromium, screenshot_path
from .conftest import ServerThread

require_chromium()


def test_the_item_page_explains_why_it_waits(tmp_path: Path, browser: Any) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'dash.db'}")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    operator = tokens.create_for_all_apps(["produce", "consume", "admin"])[0]
    now = now_ms(q.clock)
    beat = Heartbeat("worker-1", "host", 1, now, now, 60_000, 8, 2, 2, None, None, ())
    heartbeats.beat(q.kv, q.keys, beat, now)
    q.set_tenant_limit("shop", "acme", max_running=2)
    q.set_weight("shop", "acme", 2)
    for _ in range(2):
        q.enqueue("email", {"to": "a@example.com"}, app="shop", tenant="acme")
    waiting = q.enqueue("email", {"to": "b@example.com"}, app="shop", tenant="acme",
                        priority=5, item_id="order-1001")  # fmt: skip
    # What a consumer's visit does: the tenant's two slots taken, its two items leased.
    q.limits.acquire_slots("tenant", ("shop", "acme"), "worker-1", 2, 2, 600_000)
    running, _ = q.zones.dequeue(q.zone("shop", "acme"), 2, 600_000)
    try:
        with ServerThread(create_app(q)) as server:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(server.url + "/login")
            page.fill("#token", operator)
            page.click("#sign-in")
            page.wait_for_selector("h1:has-text('Overview')")
            page.goto(server.url + "/apps/shop/tenants/acme")
            page.click(f"a:has-text('{waiting}')")
            page.wait_for_selector("h1:has-text('Item order-1001')")
            first = page.locator("[data-figure=first]").inner_text()
            assert first.startswith("tenant_cap: tenant cap 2 of 2 running")
            assert all(i.item_id in first for i in running)
            assert page.locator("[data-rule=tenant_cap]").inner_text().count("holds") == 1
            assert "weight 2" in page.locator("[data-rule=weight]").inner_text()
            page.screenshot(path=str(screenshot_path("serve-item-explain.png")), full_page=True)
            page.close()
    finally:
        q.close()

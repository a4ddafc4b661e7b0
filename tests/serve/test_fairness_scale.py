"""Issue 43 point 3: the fairness view of an app with 20,000 tenants reads a bounded
number of keys and sends a bounded page, whatever the tenant count; the tenants that
matter come first (the one waiting longest, the noisiest, a paused one and a capped one
are all on page 1); a search finds a tenant; each section pages on with a cursor; and
the live refresh answers only the rows that changed, or 304 when nothing did."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.store import pickups
from quickzones.store.kv import KVTransaction
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV

from .conftest import ServerThread

TENANTS = 20_000
OLD, NOISY, PAUSED, CAPPED = "t-004321", "t-012345", "t-017000", "t-009999"
MAX_KEYS = 1_500  # a page's reads; the unpaged view read every item (20,000 and more)
MAX_BYTES = 200_000


@dataclass
class Big:
    q: Quick
    kv: CountingKV
    client: httpx.Client


def _fill(q: Quick, clock: ManualClock) -> None:
    # The oldest tenant's item vested a minute before everyone else's.
    q.enqueue("job", 0, app="a", tenant=OLD)
    clock.advance(60)
    for start in range(0, TENANTS, 2000):

        def fill(tr: KVTransaction, start: int = start) -> None:
            for i in range(start, start + 2000):
                if f"t-{i:06d}" != OLD:
                    q.enqueue("job", i, app="a", tenant=f"t-{i:06d}", tr=tr)

        q.transact(fill)
    # Pickups as consumers flush them: 3,000 tenants picked up once each, the noisy
    # one 400 times (in two flushes, as two consumers would).
    now = now_ms(clock)
    minute = pickups.minute_of(now)
    spread = {("a", f"t-{i:06d}", minute, 2): 1 for i in range(3000)}
    pickups.add_counts(q.kv, q.keys, spread, now)
    pickups.add_counts(q.kv, q.keys, {("a", NOISY, minute, 4): 150}, now)
    pickups.add_counts(q.kv, q.keys, {("a", NOISY, minute - 1, 5): 250}, now)
    q.pause("a", PAUSED)
    q.set_tenant_limit("a", CAPPED, max_running=2)


@pytest.fixture(scope="module")
def big() -> Iterator[Big]:
    clock = ManualClock(1_700_000_000.0)
    kv = CountingKV(open_kv("memory://", clock=clock))
    q = Quick(kv, clock=clock)  # type: ignore[arg-type]
    _fill(q, clock)
    token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
    try:
        with ServerThread(create_app(q)) as server:
            client = httpx.Client(base_url=server.url, timeout=60)
            assert client.post("/login", data={"token": token}).status_code == 303
            yield Big(q, kv, client)
    finally:
        q.close()


def _get(big: Big, path: str, **params: str) -> httpx.Response:
    big.kv.keys_read = 0
    return big.client.get(path, params=params)


def _section_tenants(html: str, section: str) -> list[str]:
    start = html.index(f'data-section="{section}"')
    end = html.index("</table>", start)
    return [part.split('"', 1)[0] for part in html[start:end].split('data-tenant="')[1:]]


def test_the_tenants_that_matter_come_first_on_a_bounded_page(big: Big) -> None:
    r = _get(big, "/apps/a/fairness")
    assert r.status_code == 200, r.text
    assert big.kv.keys_read <= MAX_KEYS, big.kv.keys_read
    assert len(r.content) < MAX_BYTES, len(r.content)
    html = r.text
    assert _section_tenants(html, "waiting")[0] == OLD
    assert _section_tenants(html, "noisy")[0] == NOISY
    assert 'class="tag noisy"' in html.split(f'data-tenant="{NOISY}"', 1)[1].split("</tr>")[0]
    assert _section_tenants(html, "paused") == [PAUSED]
    assert _section_tenants(html, "capped") == [CAPPED]
    assert len(_section_tenants(html, "waiting")) == 10


def test_sections_page_on_with_a_cursor(big: Big) -> None:
    seen: list[str] = []
    params = {"section": "waiting", "limit": "50"}
    for _ in range(3):
        r = _get(big, "/apps/a/fairness", **params)
        assert r.status_code == 200, r.text
        assert big.kv.keys_read <= MAX_KEYS, big.kv.keys_read
        page = _section_tenants(r.text, "waiting")
        assert len(page) == 50
        seen += page
        cursor = r.text.split('data-next-cursor="', 1)[1].split('"', 1)[0]
        params = {"section": "waiting", "limit": "50", "cursor": cursor}
    assert seen[0] == OLD and len(set(seen)) == 150  # each row once, in vesting order
    bad = _get(big, "/apps/a/fairness", section="waiting", cursor="!!")
    assert bad.status_code == 400 and "cursor" in bad.text
    odd = _get(big, "/apps/a/fairness", section="loudest")
    assert odd.status_code == 400 and "section" in odd.text


def test_search_finds_a_tenant_on_page_one(big: Big) -> None:
    # A search is a prefix of the name: a key range, found however far in it lies.
    r = _get(big, "/apps/a/fairness", search="t-019876")
    assert r.status_code == 200, r.text
    assert big.kv.keys_read <= MAX_KEYS, big.kv.keys_read
    assert _section_tenants(r.text, "search")[:1] == ["t-019876"]
    prefix = _get(big, "/apps/a/fairness", search="t-0198")
    assert _section_tenants(prefix.text, "search")[:3] == ["t-019800", "t-019801", "t-019802"]
    nobody = _get(big, "/apps/a/fairness", search="u-")
    assert _section_tenants(nobody.text, "search") == [] and ">none<" in nobody.text


def test_live_refresh_sends_what_changed_or_304(big: Big) -> None:
    r = _get(big, "/apps/a/fairness.json")
    assert r.status_code == 200, r.text
    assert big.kv.keys_read <= MAX_KEYS, big.kv.keys_read
    assert len(r.content) < MAX_BYTES
    body = r.json()
    assert body["sections"]["waiting"]["tenants"][0] == OLD
    version = body["version"]
    # Nothing changed: 304, no body.
    again = _get(big, "/apps/a/fairness.json", since=version)
    assert again.status_code == 304 and again.content == b""
    # One shown tenant gets more items: only its row comes back.
    big.q.enqueue_many("job", [1, 2, 3], app="a", tenant=OLD)
    changed = _get(big, "/apps/a/fairness.json", since=version)
    assert changed.status_code == 200, changed.text
    parts = changed.json()["parts"]
    assert list(parts) == [f"waiting/{OLD}"], list(parts)
    assert 'data-col="queued">4<' in parts[f"waiting/{OLD}"]
    assert changed.json()["sections"]["waiting"]["tenants"][0] == OLD
    # A version that is not one: the whole view, as at first.
    whole = _get(big, "/apps/a/fairness.json", since="not-a-version")
    assert whole.status_code == 200 and len(whole.json()["parts"]) > 10

"""Issue 43 point 2 over HTTP, the dashboard and the CLI: a page of dead letters or of a
zone's items is read from the store from an opaque cursor, so ``limit=1`` costs a
handful of keys however many lie behind it; following ``next_cursor`` returns each row
once, in order; a bad cursor is a 400 in the API's error shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from quickzones.adapters.http import TokenStore, create_app
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV, bury

from .conftest import Served, ServerThread


@pytest.fixture
def counted_server() -> Iterator[tuple[Quick, CountingKV, str, dict[str, str]]]:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["produce", "consume", "admin"])[0]
    try:
        with ServerThread(create_app(q)) as server:
            yield q, kv, server.url, {"Authorization": f"Bearer {token}"}
    finally:
        q.close()


def test_limit_one_over_http_reads_a_handful_of_keys(
    counted_server: tuple[Quick, CountingKV, str, dict[str, str]],
) -> None:
    q, kv, url, h = counted_server
    bury(q, "a", "t", [f"i{n:06d}" for n in range(20_000)])
    q.enqueue_many("j", list(range(5000)), app="a", tenant="deep")
    kv.keys_read = 0
    r = httpx.get(url + "/v1/apps/a/dead-letters", params={"limit": 1}, headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["item_id"] for d in body["dead_letters"]] == ["i000000"]
    assert body["next_cursor"] and "total" not in body
    # A request reads its token and the letters it shows, not the 20,000 behind them.
    assert kv.keys_read <= 20, kv.keys_read
    kv.keys_read = 0
    r = httpx.get(url + "/v1/apps/a/tenants/deep/items", params={"limit": 1}, headers=h)
    assert r.status_code == 200, r.text
    items = r.json()
    assert len(items["items"]) == 1 and items["total"] == 5000 and items["next_cursor"]
    assert kv.keys_read <= 20, kv.keys_read


def _follow(
    url: str, path: str, h: dict[str, str], key: str, limit: int, **filters: str
) -> list[Any]:
    out: list[Any] = []
    params: dict[str, Any] = {"limit": limit, **filters}
    while True:
        r = httpx.get(url + path, params=params, headers=h)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body[key]) <= limit
        out += body[key]
        if body["next_cursor"] is None:
            return out
        params["cursor"] = body["next_cursor"]


def test_following_the_cursor_shows_each_row_once_in_order(served: Served) -> None:
    q = served.q
    expected = []
    for tenant in ("t1", "t2"):
        ids = [f"{tenant}-{n:04d}" for n in range(130)]
        bury(q, "a", tenant, ids)
        expected += ids
    bury(q, "b", "t1", ["hidden"])
    h = {"Authorization": f"Bearer {served.a_all}"}
    letters = _follow(served.url, "/v1/apps/a/dead-letters", h, "dead_letters", 50)
    assert [d["item_id"] for d in letters] == expected
    t2 = _follow(served.url, "/v1/apps/a/dead-letters", h, "dead_letters", 7, tenant="t2")
    assert [d["item_id"] for d in t2] == expected[130:]
    q.enqueue_many("j", list(range(120)), app="a", tenant="z")
    items = _follow(served.url, "/v1/apps/a/tenants/z/items", h, "items", 50)
    ids = [i["item_id"] for i in items]
    assert len(ids) == 120 and ids == sorted(set(ids))


@pytest.mark.parametrize("cursor", ["!!", "AAAA", "x" * 300])
def test_a_bad_cursor_is_a_400_in_the_apis_shape(served: Served, cursor: str) -> None:
    bury(served.q, "a", "t", ["x"])
    h = {"Authorization": f"Bearer {served.a_all}"}
    for path in ("/v1/apps/a/dead-letters", "/v1/apps/a/tenants/t/items"):
        r = httpx.get(served.url + path, params={"cursor": cursor}, headers=h)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["error"] == "invalid_argument" and "cursor" in body["detail"]


def test_the_dashboard_pages_with_a_cursor(served: Served) -> None:
    q = served.q
    bury(q, "a", "t", [f"i{n:04d}" for n in range(250)])
    q.enqueue_many("j", list(range(150)), app="a", tenant="z")
    client = httpx.Client(base_url=served.url)
    assert client.post("/login", data={"token": served.a_all}).status_code == 303
    seen: list[str] = []
    path = "/apps/a/dead-letters"
    while True:
        page = client.get(path)
        assert page.status_code == 200, page.text
        seen += re.findall(r'data-requeue="([^"]+)"', page.text)
        nxt = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        if nxt is None:
            break
        path = "/apps/a/dead-letters" + nxt[1].replace("&amp;", "&")
    assert seen == [f"i{n:04d}" for n in range(250)]
    zone = client.get("/apps/a/tenants/z")
    assert zone.status_code == 200 and "150 items" in zone.text


def test_the_cli_lists_a_page_and_prints_the_next_cursor(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    with Quick.open(store) as q:
        bury(q, "a", "t", [f"i{n}" for n in range(5)])
    shown: list[str] = []
    args = ["--store", store, "dead-letters", "list", "--app", "a", "--limit", "2", "--json"]
    cursor: list[str] = []
    while True:
        result = CliRunner().invoke(main, args + cursor)
        assert result.exit_code == 0, result.stderr
        shown += [d["item_id"] for d in json.loads(result.stdout)]
        found = re.search(r"next cursor: (\S+)", result.stderr)
        if found is None:
            break
        cursor = ["--cursor", found[1]]
    assert shown == [f"i{n}" for n in range(5)]
    bad = CliRunner().invoke(main, [*args, "--cursor", "!!"])
    assert bad.exit_code != 0 and "cursor" in bad.stderr


def test_zones_are_paged_across_shards_each_once_in_order() -> None:
    """An app's active zones, over 4 shards, a page at a time: a page reads about what it
    shows (per shard), never every zone; following the cursor (with and without a search)
    shows each zone once, in tenant order."""
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv, shards=4)  # type: ignore[arg-type]
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["admin"])[0]
    h = {"Authorization": f"Bearer {token}"}
    tenants = [f"t{n:05d}" for n in range(1500)]
    for tenant in tenants:
        q.enqueue("j", 1, app="a", tenant=tenant)
    q.enqueue("j", 1, app="b", tenant="hidden")
    try:
        with ServerThread(create_app(q)) as server:
            kv.keys_read = 0
            r = httpx.get(server.url + "/v1/apps/a/zones", params={"limit": 1}, headers=h)
            assert r.status_code == 200, r.text
            assert [z["tenant"] for z in r.json()["zones"]] == ["t00000"]
            assert kv.keys_read <= 40, kv.keys_read
            zones = _follow(server.url, "/v1/apps/a/zones", h, "zones", 200)
            assert [z["tenant"] for z in zones] == tenants
            assert all(z["items"] == 1 for z in zones)
            found = _follow(server.url, "/v1/apps/a/zones", h, "zones", 7, search="9")
            assert [z["tenant"] for z in found] == [t for t in tenants if "9" in t]
            r = httpx.get(server.url + "/v1/apps/a/zones", params={"cursor": "!!"}, headers=h)
            assert r.status_code == 400 and r.json()["error"] == "invalid_argument"
    finally:
        q.close()

"""Issue 43 point 2 over HTTP and the CLI: an app's weights, tenant limits and pauses
(``GET /v1/apps/{app}/weights``, ``/tenant-limits``, ``/pauses``) and the serve tokens
(``quick tokens list``) are read from the store a page at a time from an opaque cursor:
``limit=10`` over 2,000 reads a handful of keys, following ``next_cursor`` returns each
row once in order, and a bad cursor is a 400 in the API's error shape (a CLI error)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteQuick
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV

from .conftest import Served, ServerThread

N = 2000
TENANTS = [f"t{n:05d}" for n in range(N)]

# path below /v1/apps/a, the answer's list, how to store one of tenant t, a row's tenant
LISTS: dict[str, tuple[str, str, Callable[[Quick, str, str], object]]] = {
    "weights": ("weights", "weights", lambda q, app, t: q.set_weight(app, t, 2)),
    "tenant-limits": (
        "tenant-limits",
        "limits",
        lambda q, app, t: q.set_tenant_limit(app, t, max_running=2),
    ),
    "pauses": ("pauses", "pauses", lambda q, app, t: q.pause(app, t)),
}


@pytest.fixture
def counted() -> Iterator[tuple[Quick, CountingKV, str, dict[str, str]]]:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["admin"])[0]
    for name, (_, _, store) in LISTS.items():
        for tenant in TENANTS:
            store(q, "a", tenant)
        store(q, "b", f"hidden-{name}")
    try:
        with ServerThread(create_app(q)) as server:
            yield q, kv, server.url, {"Authorization": f"Bearer {token}"}
    finally:
        q.close()


def _follow(url: str, h: dict[str, str], key: str, limit: int) -> list[Any]:
    out: list[Any] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        r = httpx.get(url, params=params, headers=h)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body[key]) <= limit
        out += body[key]
        if body["next_cursor"] is None:
            return out
        params["cursor"] = body["next_cursor"]


@pytest.mark.parametrize("name", sorted(LISTS))
def test_a_page_over_http_reads_what_it_shows_and_the_cursor_shows_each_row_once(
    counted: tuple[Quick, CountingKV, str, dict[str, str]], name: str
) -> None:
    q, kv, url, h = counted
    path, key, store = LISTS[name]
    url = f"{url}/v1/apps/a/{path}"
    kv.keys_read = 0
    r = httpx.get(url, params={"limit": 10}, headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [row["tenant"] for row in body[key]] == TENANTS[:10]
    assert body["next_cursor"]
    # Its token, the ten rows and the one after them: not the 2,000 behind them.
    assert kv.keys_read <= 20, kv.keys_read
    # Without a limit: the first 50 (a client that ignores next_cursor).
    r = httpx.get(url, headers=h)
    assert [row["tenant"] for row in r.json()[key]] == TENANTS[:50]
    first = r.json()["next_cursor"]
    # A write between two pages: one before the cursor, one after it; neither repeats
    # nor shifts the rest.
    store(q, "a", "t00000a")
    store(q, "a", "t99999")
    rest: list[str] = []
    params = {"limit": 333, "cursor": first}
    while params["cursor"] is not None:
        page = httpx.get(url, params=params, headers=h).json()
        rest += [row["tenant"] for row in page[key]]
        params["cursor"] = page["next_cursor"]
    assert rest == [*TENANTS[50:], "t99999"]
    rows = _follow(url, h, key, 500)
    assert len(rows) == N + 2 and all(row["app"] == "a" for row in rows)


@pytest.mark.parametrize("name", sorted(LISTS))
def test_a_bad_cursor_is_a_400_in_the_apis_shape(served: Served, name: str) -> None:
    path, _, store = LISTS[name]
    store(served.q, "a", "t1")
    h = {"Authorization": f"Bearer {served.a_all}"}
    for cursor in ("!!", "AAAA", "x" * 300):
        r = httpx.get(f"{served.url}/v1/apps/a/{path}", params={"cursor": cursor}, headers=h)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["error"] == "invalid_argument" and "cursor" in body["detail"]
    # Another app's cursor is not one of this list's either.
    store(served.q, "b", "t1")
    store(served.q, "b", "t2")
    hb = {"Authorization": f"Bearer {served.b_all}"}
    other = httpx.get(f"{served.url}/v1/apps/b/{path}", params={"limit": 1}, headers=hb)
    foreign = other.json()["next_cursor"]
    r = httpx.get(f"{served.url}/v1/apps/a/{path}", params={"cursor": foreign}, headers=h)
    assert r.status_code == 400 and r.json()["error"] == "invalid_argument", r.text
    for limit in (0, 1001):
        r = httpx.get(f"{served.url}/v1/apps/a/{path}", params={"limit": limit}, headers=h)
        assert r.status_code in (400, 422), r.text


def test_the_python_client_follows_the_pages(served: Served) -> None:
    """RemoteQuick.weights/tenant_limits/paused still answer the whole list (following
    next_cursor), and take a page when asked for one."""
    for n in range(120):
        served.q.set_weight("a", f"t{n:03d}", 2)
        served.q.set_tenant_limit("a", f"t{n:03d}", rate=5)
        served.q.pause("a", f"t{n:03d}")
    with RemoteQuick(served.url, served.a_all) as client:
        assert len(client.weights("a")) == 120
        assert len(client.tenant_limits("a")) == 120
        assert len(client.paused("a")) == 120


def _cli_pages(args: list[str]) -> tuple[list[Any], int]:
    """Every row a command lists following its printed cursors, and how many pages."""
    shown: list[Any] = []
    cursor: list[str] = []
    pages = 0
    while True:
        result = CliRunner().invoke(main, args + cursor)
        assert result.exit_code == 0, result.output
        shown += json.loads(result.stdout)
        pages += 1
        found = re.search(r"next cursor: (\S+)", result.stderr)
        if found is None:
            return shown, pages
        cursor = ["--cursor", found[1]]


def test_the_cli_lists_a_page_and_prints_the_next_cursor(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    with Quick.open(store) as q:
        for n in range(7):
            q.set_weight("a", f"t{n}", 2)
            q.set_tenant_limit("a", f"t{n}", max_running=1)
            q.pause("a", f"t{n}")
        q.set_weight("b", "hidden", 2)
        tokens = TokenStore(q.kv, q.keys, q.clock)
        ids = sorted(tokens.create("a", ["admin"])[1].token_id for _ in range(5))
    base = ["--store", store]
    for command in (["weight", "show"], ["limit", "show"], ["paused"]):
        rows, pages = _cli_pages([*base, *command, "--app", "a", "--limit", "2", "--json"])
        assert [r["tenant"] for r in rows] == [f"t{n}" for n in range(7)], command
        assert pages == 4
        bad = CliRunner().invoke(main, [*base, *command, "--cursor", "!!"])
        assert bad.exit_code == 2 and "cursor" in bad.stderr, bad.output
        # Without --limit: the whole list, as before.
        whole = CliRunner().invoke(main, [*base, *command, "--json"])
        assert whole.exit_code == 0 and len(json.loads(whole.stdout)) >= 7
    weights, _ = _cli_pages([*base, "weight", "show", "--limit", "3", "--json"])
    assert [w["app"] for w in weights] == ["a"] * 7 + ["b"]
    listed, pages = _cli_pages([*base, "tokens", "list", "--limit", "2", "--json"])
    assert [t["token_id"] for t in listed] == ids and pages == 3
    bad = CliRunner().invoke(main, [*base, "tokens", "list", "--cursor", "AAAA"])
    assert bad.exit_code == 2 and "cursor" in bad.stderr, bad.output

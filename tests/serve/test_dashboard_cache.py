"""Issue 41, point 14: the dashboard's cache of searches is bounded (least recently used
entries go first): 400 distinct searches of an app's tenants keep at most
``CACHE_MAX`` entries, where before each one kept its own for the process's life
(+28 MB over 4,000 searches)."""

from __future__ import annotations

import httpx

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.dashboard import CACHE_MAX, COOKIE
from quickzones.client import Quick

from .conftest import ServerThread

SEARCHES = 400


def test_400_searches_keep_at_most_cache_max_entries() -> None:
    assert CACHE_MAX < SEARCHES
    q = Quick.open("memory://")
    try:
        for n in range(20):
            q.enqueue("job", n, app="a", tenant=f"tenant-{n}")
        tokens = TokenStore(q.kv, q.keys, q.clock)
        token = tokens.create("a", ["admin"])[0]
        app = create_app(q, tokens=tokens)
        with (
            ServerThread(app) as server,
            httpx.Client(base_url=server.url, cookies={COOKIE: token}, timeout=30) as client,
        ):
            for n in range(SEARCHES):
                r = client.get("/apps/a", params={"search": f"tenant-{n}"})
                assert r.status_code == 200, r.text
            board = app.state.dashboard
            assert len(board.cache) <= CACHE_MAX, len(board.cache)
            # The least recently used went first: the latest search is still cached, and
            # a page looked at all along stays.
            assert f"tenants:a:tenant-{SEARCHES - 1}" in board.cache
            assert client.get("/").status_code == 200
            assert "app:a" in board.cache
    finally:
        q.close()

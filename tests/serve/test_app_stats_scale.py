"""Issue 43's targets for ``GET /v1/apps/{app}/stats`` and the dashboard's first page: the
app's dead letters are counted by counters kept with them (backfilled, a bounded step a
request, for a store written before the counters existed), and the per-item figures and
the active zones come from a scan of at most a bounded number of keys, the response
saying which figures are exact. Costs are the store's keys read, never a time."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.client import Quick
from quickzones.store import admin, dead_groups
from quickzones.store.kv import KVTransaction
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV, bury
from tests.waiting import wait_for

from .conftest import ServerThread

LETTERS = 20_000
TENANTS = 3_000


@pytest.fixture
def big() -> Iterator[tuple[Quick, CountingKV, str, dict[str, str]]]:
    """App ``a`` with 20,000 dead letters and 3,000 zones of one item each."""
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["produce", "consume", "admin"])[0]
    bury(q, "a", "t", [f"i{n:06d}" for n in range(LETTERS)])
    for first in range(0, TENANTS, 1000):

        def fill(tr: KVTransaction, first: int = first) -> None:
            for n in range(first, first + 1000):
                q.enqueue("mail" if n % 3 else "job", {"n": n}, app="a", tenant=f"u{n:05d}", tr=tr)

        q.transact(fill)
    try:
        with ServerThread(create_app(q)) as server:
            yield q, kv, server.url, {"Authorization": f"Bearer {token}"}
    finally:
        q.close()


def _forget_counters(q: Quick, app: str) -> None:
    """Make the store look written before the counters existed: no count, no backfill
    state, and group counts of the letters written since groups were kept (stale)."""

    def clear(tr: KVTransaction) -> None:
        tr.clear(q.keys.meta_key("dead-total", app))
        tr.clear(q.keys.meta_key("dead-counted", app))
        tr.clear_range(*q.keys.meta_range("dead-groups", app))
        tr.add(q.keys.meta_key("dead-groups", app, "j", "buried"), (7).to_bytes(8, "little"))

    q.transact(clear)


def test_app_stats_reads_a_bounded_number_of_keys_and_says_what_is_exact(
    big: tuple[Quick, CountingKV, str, dict[str, str]],
) -> None:
    q, kv, url, h = big
    for n in range(300):
        q.pause(app="a", tenant=f"u{n:05d}")
    _forget_counters(q, "a")  # after the server's counting thread looked: it waits now
    dead_groups.advance(q.kv, q.keys, "a")  # a backfill under way: 1,000 keys counted
    kv.keys_read = 0
    r = httpx.get(url + "/v1/apps/a/stats", headers=h)
    assert r.status_code == 200, r.text
    body = r.json()
    # 20,000 letters and 9,000 zone keys lie behind it; a request reads a bounded few.
    assert kv.keys_read <= 7_000, kv.keys_read
    assert 0 < body["dead_letters"] < LETTERS and body["exact"]["dead_letters"] is False
    assert body["exact"]["items"] is False and body["exact"]["active_zones"] is False
    assert 0 < body["items"] < TENANTS and 0 < body["active_zones"] < TENANTS
    assert body["items"] == sum(body["by_job_type"].values())
    assert body["scan_limit"] > 0
    # The first pauses, and where the rest are (a page, not all 300).
    assert len(body["paused"]) == 100 and body["paused_next_cursor"]
    more = httpx.get(
        url + "/v1/apps/a/pauses",
        params={"cursor": body["paused_next_cursor"], "limit": 500},
        headers=h,
    ).json()
    assert len(more["pauses"]) == 200
    # Counted to the end (as the server's thread does), a request reads the count.
    assert admin.count_dead_letters(q, "a") == LETTERS
    kv.keys_read = 0
    r = httpx.get(url + "/v1/apps/a/stats", headers=h)
    assert r.json()["dead_letters"] == LETTERS and r.json()["exact"]["dead_letters"]
    assert kv.keys_read <= 7_000, kv.keys_read
    # The group counts were rebuilt too (the stale 7 is gone), and kept from then on.
    assert dead_groups.group_count(q.kv, q.keys, "a", ("j", "buried")) == LETTERS


def test_a_small_app_is_exact_at_once(
    big: tuple[Quick, CountingKV, str, dict[str, str]],
) -> None:
    q, _, url, _ = big
    token = TokenStore(q.kv, q.keys, q.clock).create("small", ["admin", "produce"])[0]
    hs = {"Authorization": f"Bearer {token}"}
    bury(q, "small", "s", ["d1", "d2", "d3"])
    q.enqueue("mail", {}, app="small", tenant="s")
    q.enqueue("job", {}, app="small", tenant="s2")
    body = httpx.get(url + "/v1/apps/small/stats", headers=hs).json()
    assert body["dead_letters"] == 3 and body["items"] == 2 and body["active_zones"] == 2
    assert body["exact"] == {"dead_letters": True, "items": True, "active_zones": True}
    assert body["by_job_type"] == {"mail": 1, "job": 1}


def test_the_dashboards_first_page_reads_a_bounded_number_of_keys(
    big: tuple[Quick, CountingKV, str, dict[str, str]],
) -> None:
    _, kv, url, h = big
    with httpx.Client(base_url=url) as c:
        c.post("/login", data={"token": h["Authorization"].split()[1]})
        kv.keys_read = 0
        r = c.get("/overview.json")
        assert r.status_code == 200, r.text
        assert kv.keys_read <= 12_000, kv.keys_read
        row = r.json()["apps"][0]
        assert row["app"] == "a" and row["items"] > 0 and row["zones"] > 0


def test_shards_read_a_bounded_number_of_pointers(
    big: tuple[Quick, CountingKV, str, dict[str, str]],
) -> None:
    q, kv, url, _ = big
    token = TokenStore(q.kv, q.keys, q.clock).create_for_all_apps(["admin"])[0]
    kv.keys_read = 0
    r = httpx.get(url + "/v1/shards", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    (shard,) = r.json()["shards"]  # 3,000 pointers in one shard
    assert shard["exact"] is False and 0 < shard["pointers"] < TENANTS
    assert kv.keys_read <= 1_100, kv.keys_read


def test_the_server_counts_a_store_written_without_counters_on_its_own() -> None:
    q = Quick.open("memory://")
    bury(q, "a", "t", [f"i{n:05d}" for n in range(5000)])
    bury(q, "b", "t", ["x"])
    _forget_counters(q, "a")
    _forget_counters(q, "b")
    try:
        with ServerThread(create_app(q)):
            # No request: the server's own thread counts every app's letters, online.
            assert wait_for(
                lambda: dead_groups.total(q.kv, q.keys, "a", steps=0).exact
                and dead_groups.total(q.kv, q.keys, "b", steps=0).exact
            )
        assert dead_groups.total(q.kv, q.keys, "a", steps=0) == dead_groups.Total(5000, True)
        assert dead_groups.total(q.kv, q.keys, "b", steps=0) == dead_groups.Total(1, True)
    finally:
        q.close()

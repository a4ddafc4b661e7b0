"""Issue 43 point 2: a page of dead letters is read from the store a page at a time, from
an opaque cursor: ``limit=1`` over 20,000 letters reads a handful of keys, not 20,000, and
paging through with the cursor returns each letter exactly once, in order, also when
letters come and go between pages."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.store import admin
from quickzones.store.kv import KVTransaction
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV, bury


@pytest.fixture
def counted() -> tuple[Quick, CountingKV]:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    return q, kv


def _ids(n: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{k:06d}" for k in range(n)]


def test_limit_one_reads_a_handful_of_keys_not_every_letter(
    counted: tuple[Quick, CountingKV],
) -> None:
    q, kv = counted
    bury(q, "a", "t", _ids(20_000))
    kv.keys_read = 0
    [letter] = q.dead_letters("a", limit=1)
    assert letter.item_id == "i000000"
    assert kv.keys_read <= 10, kv.keys_read
    kv.keys_read = 0
    page = q.dead_letter_page("a", limit=1)
    assert [x.item_id for x in page.rows] == ["i000000"] and page.next_cursor is not None
    assert kv.keys_read <= 10, kv.keys_read
    # A page deep into the list costs the same as the first.
    kv.keys_read = 0
    for _ in range(3):
        page = q.dead_letter_page("a", limit=50, cursor=page.next_cursor)
    assert kv.keys_read <= 3 * 60, kv.keys_read


def test_a_page_with_a_filter_reads_a_bounded_number_of_letters(
    counted: tuple[Quick, CountingKV],
) -> None:
    """A job type is not part of the key: a page passes over at most a bounded number of
    other letters, then ends short, with a cursor to go on from."""
    q, kv = counted
    bury(q, "a", "t", _ids(20_000), job_type="other")
    bury(q, "a", "u", ["last"], job_type="wanted")
    kv.keys_read = 0
    page = q.dead_letter_page("a", job_type="wanted", limit=10)
    assert page.rows == [] and page.next_cursor is not None
    assert kv.keys_read <= 1200, kv.keys_read
    found = []
    cursor: str | None = None
    while True:
        page = q.dead_letter_page("a", job_type="wanted", limit=10, cursor=cursor)
        found += [x.item_id for x in page.rows]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert found == ["last"]


def test_a_tenant_across_apps_skips_other_tenants_letters(
    counted: tuple[Quick, CountingKV],
) -> None:
    """A tenant alone is not a key prefix; its letters in many apps are found by reads
    that pass over other tenants, not by reading their letters."""
    q, kv = counted
    for app in ("a", "b", "c"):
        bury(q, app, "other", _ids(3000))
        bury(q, app, "t", [f"{app}-1", f"{app}-2"])
        bury(q, app, "z", _ids(3000))
    kv.keys_read = 0
    page = q.dead_letter_page(tenant="t", limit=100)
    assert [x.item_id for x in page.rows] == ["a-1", "a-2", "b-1", "b-2", "c-1", "c-2"]
    assert page.next_cursor is None
    assert kv.keys_read <= 50, kv.keys_read


def _all(q: Quick, limit: int, between: Any = None, **filters: Any) -> list[str]:
    out: list[str] = []
    cursor: str | None = None
    while True:
        page = q.dead_letter_page(limit=limit, cursor=cursor, **filters)
        assert len(page.rows) <= limit
        out += [f"{x.zone.app}/{x.zone.tenant}/{x.item_id}" for x in page.rows]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor
        if between is not None:
            between(out)


def test_paging_returns_each_letter_once_in_order(q: Quick) -> None:
    expected = []
    for app, tenant in (("a", "t1"), ("a", "t2"), ("b", "t1")):
        ids = _ids(37, prefix=f"{tenant}-")
        bury(q, app, tenant, ids)
        expected += [f"{app}/{tenant}/{i}" for i in ids]
    assert _all(q, 10) == sorted(expected) == expected
    assert _all(q, 1, app="a") == [x for x in expected if x.startswith("a/")]
    assert _all(q, 7, app="a", tenant="t1") == [x for x in expected if x.startswith("a/t1/")]
    assert _all(q, 5, tenant="t1") == [x for x in expected if "/t1/" in x]
    assert _all(q, 1000) == expected
    one = "t1-000005"
    assert _all(q, 3, app="a", item_id=one) == ["a/t1/t1-000005"]
    assert _all(q, 3, item_id=one) == ["a/t1/t1-000005", "b/t1/t1-000005"]
    assert _all(q, 3, tenant="t1", item_id=one) == ["a/t1/t1-000005", "b/t1/t1-000005"]
    assert _all(q, 3, app="b", tenant="t1", item_id=one) == ["b/t1/t1-000005"]
    assert _all(q, 3, app="b", tenant="t1", item_id=one, job_type="other") == []


def test_letters_added_and_removed_between_pages(q: Quick) -> None:
    """Between two pages a letter comes before the cursor, one after it, and one after
    it goes: the one before is not shown (it is behind), the one after is, the one gone
    is not, and no other letter is skipped or shown twice."""
    bury(q, "a", "t", [f"m{k:03d}" for k in range(0, 100, 2)])  # m000, m002, ... m098
    behind: set[str] = set()
    ahead: set[str] = set()
    gone: set[str] = set()

    def churn(shown: list[str]) -> None:
        at = int(shown[-1].split("/")[2][1:])  # the cursor's letter, an even number
        behind.add(f"m{at - 1:03d}")
        ahead.add(f"m{at + 3:03d}")
        bury(q, "a", "t", [f"m{at - 1:03d}", f"m{at + 3:03d}"])
        letter = q.zones.read_dead_letter(q.zone("a", "t"), f"m{at + 4:03d}")
        if letter is not None:
            gone.add(letter.item_id)
            admin.purge(q, [letter])

    ids = [x.split("/")[2] for x in _all(q, 5, churn, app="a")]
    assert len(ids) == len(set(ids)), "a letter was shown twice"
    assert ids == sorted(ids)
    stayed = {f"m{k:03d}" for k in range(0, 100, 2)} - gone
    assert set(ids) == stayed | ahead


@pytest.mark.parametrize("cursor", ["", "not base64 !", "AAAA", "////", "x" * 5000, "AhQA"])
def test_a_bad_cursor_is_a_clear_error(q: Quick, cursor: str) -> None:
    bury(q, "a", "t", _ids(3))
    with pytest.raises(InvalidArgument, match="cursor"):
        q.dead_letter_page("a", cursor=cursor)


def test_a_cursor_of_another_apps_list_is_refused(q: Quick) -> None:
    bury(q, "a", "t", _ids(3))
    bury(q, "b", "t", _ids(3))
    page = q.dead_letter_page("a", limit=1)
    assert page.next_cursor is not None
    with pytest.raises(InvalidArgument, match="cursor"):
        q.dead_letter_page("b", cursor=page.next_cursor)


def test_large_letters_with_chunks_page_whole(q: Quick) -> None:
    """Letters whose item is kept in chunk keys come back whole, each once."""
    q.max_payload = 2_000_000
    for n in range(4):
        q.enqueue("big", b"x" * 300_000, app="a", tenant="t", item_id=f"b{n}")

    def bury_all(tr: KVTransaction) -> None:
        for n in range(4):
            q.zones.dead_letter(q.zone("a", "t"), f"b{n}", None, "buried", tr=tr)

    q.transact(bury_all)
    seen = []
    cursor: str | None = None
    while True:
        page = q.dead_letter_page("a", limit=1, cursor=cursor)
        for x in page.rows:
            assert x.item is not None and len(x.item.payload) == 300_000
            seen.append(x.item_id)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["b0", "b1", "b2", "b3"]


def test_async_quick_pages_the_same_way(q: Quick) -> None:
    import asyncio

    from quickzones.aio import AsyncQuick

    bury(q, "a", "t", _ids(5))
    aq = AsyncQuick(q)

    async def walk() -> list[str]:
        out: list[str] = []
        cursor: str | None = None
        while True:
            page = await aq.dead_letter_page("a", limit=2, cursor=cursor)
            out += [x.item_id for x in page.rows]
            if page.next_cursor is None:
                return out
            cursor = page.next_cursor

    assert asyncio.run(walk()) == _ids(5)

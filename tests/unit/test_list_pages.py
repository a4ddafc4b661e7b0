"""Issue 43 point 2: every list is paged by the store. An app's tenant weights, tenant
limits and pauses, and the serve tokens, are read a page at a time from an opaque cursor:
a page reads about what it shows however many lie behind it, following ``next_cursor``
returns every row once in key order, writes between two pages neither repeat nor skip
the rest, and a cursor that is not one of the list's is :class:`InvalidArgument`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from quickzones.adapters.http.tokens import TokenStore
from quickzones.aio import AsyncQuick
from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.store.pages import Page
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV

N = 2000


@dataclass
class Listed:
    """One list under test: how to add and drop an entry of app "a" (by tenant-ish
    name), how to read a page, and the name a row shows."""

    add: Callable[[str], None]
    drop: Callable[[str], None]
    page: Callable[..., Page[Any]]
    name: Callable[[Any], str]
    other_cursor: Callable[[], str | None]  # a cursor of another list (another app's)


def _weights(q: Quick) -> Listed:
    q.set_weight("b", "hidden-1", 2)
    q.set_weight("b", "hidden-2", 2)
    return Listed(
        add=lambda t: q.set_weight("a", t, 2),
        drop=lambda t: q.clear_weight("a", t) or None,
        page=lambda **kw: q.weight_page("a", **kw),
        name=lambda w: str(w.tenant),
        other_cursor=lambda: q.weight_page("b", limit=1).next_cursor,
    )


def _limits(q: Quick) -> Listed:
    q.set_tenant_limit("b", "hidden-1", max_running=1)
    q.set_tenant_limit("b", "hidden-2", max_running=1)
    return Listed(
        add=lambda t: q.set_tenant_limit("a", t, max_running=3) and None,
        drop=lambda t: q.clear_tenant_limit("a", t) or None,
        page=lambda **kw: q.tenant_limit_page("a", **kw),
        name=lambda x: str(x.tenant),
        other_cursor=lambda: q.tenant_limit_page("b", limit=1).next_cursor,
    )


def _pauses(q: Quick) -> Listed:
    q.pause("b", "hidden-1")
    q.pause("b", "hidden-2")
    return Listed(
        add=lambda t: q.pause("a", t) and None,
        drop=lambda t: q.resume("a", t) or None,
        page=lambda **kw: q.pause_page("a", **kw),
        name=lambda p: str(p.tenant),
        other_cursor=lambda: q.pause_page("b", limit=1).next_cursor,
    )


def _tokens(q: Quick) -> Listed:
    tokens = TokenStore(q.kv, q.keys, q.clock)
    ids: dict[str, str] = {}  # name: token id (a token's id is random: rows by id)

    def add(name: str) -> None:
        ids[name] = tokens.create("a", ["admin"], label=name)[1].token_id

    return Listed(
        add=add,
        drop=lambda name: tokens.revoke(ids.pop(name)),
        page=tokens.page,
        name=lambda t: str(t.label),
        other_cursor=lambda: None,
    )


KINDS = {"weights": _weights, "limits": _limits, "pauses": _pauses, "tokens": _tokens}


@pytest.fixture(params=sorted(KINDS))
def listed(request: pytest.FixtureRequest) -> Iterator[tuple[Quick, CountingKV, Listed, str]]:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv)  # type: ignore[arg-type]
    try:
        yield q, kv, KINDS[request.param](q), request.param
    finally:
        q.close()


def _follow(listed: Listed, cursor: str | None = None, limit: int = 97) -> list[str]:
    """Every row's name from ``cursor`` on, following the cursor with pages of ``limit``."""
    out: list[str] = []
    while True:
        got = listed.page(limit=limit, cursor=cursor)
        assert len(got.rows) <= limit
        out += [listed.name(r) for r in got.rows]
        if got.next_cursor is None:
            return out
        cursor = got.next_cursor


def _fill(listed: Listed) -> list[str]:
    names = [f"t{n:05d}" for n in range(N)]
    for name in names:
        listed.add(name)
    return names


def test_a_page_reads_what_it_shows_and_the_cursor_shows_each_row_once_in_order(
    listed: tuple[Quick, CountingKV, Listed, str],
) -> None:
    _, kv, lst, kind = listed
    names = _fill(lst)
    kv.keys_read = kv.reads = 0
    first = lst.page(limit=10)
    assert len(first.rows) == 10 and first.next_cursor is not None
    # Ten rows, the one after them, a few heads: not the 2,000 behind them.
    assert kv.keys_read <= 15, kv.keys_read
    kv.keys_read = 0
    second = lst.page(limit=10, cursor=first.next_cursor)
    assert len(second.rows) == 10 and kv.keys_read <= 15, kv.keys_read
    assert not {lst.name(r) for r in first.rows} & {lst.name(r) for r in second.rows}
    seen = _follow(lst)
    assert len(seen) == N and sorted(seen) == names
    if kind != "tokens":
        assert seen == names  # by tenant (tokens: by their random id)
    # The default page: 50.
    assert len(lst.page().rows) == 50


def test_writes_between_pages_neither_repeat_nor_skip_the_rest(
    listed: tuple[Quick, CountingKV, Listed, str],
) -> None:
    _, _, lst, kind = listed
    _fill(lst)
    first = lst.page(limit=300)
    shown = [lst.name(r) for r in first.rows]
    rest_before = _follow(lst, first.next_cursor)
    # Between two pages: one shown row dropped, one not yet shown dropped, one added.
    lst.drop(shown[5])
    lst.drop(rest_before[10])
    lst.add("t99999-new")
    rest = _follow(lst, first.next_cursor, limit=113)
    assert len(rest) == len(set(rest)) and not set(rest) & set(shown)
    expected = [n for n in rest_before if n != rest_before[10]]
    if kind == "tokens":
        # The new token lands before or after the cursor (its id is random).
        assert set(rest) - {"t99999-new"} == set(expected)
    else:
        assert rest == [*expected, "t99999-new"]


@pytest.mark.parametrize("cursor", ["!!", "AAAA", "x" * 300, ""])
def test_a_bad_cursor_is_an_invalid_argument(
    listed: tuple[Quick, CountingKV, Listed, str], cursor: str
) -> None:
    _, _, lst, _ = listed
    lst.add("t1")
    with pytest.raises(InvalidArgument, match="cursor"):
        lst.page(cursor=cursor)


def test_another_lists_cursor_and_a_bad_limit_are_refused(
    listed: tuple[Quick, CountingKV, Listed, str],
) -> None:
    _, _, lst, _ = listed
    for name in ("t1", "t2"):
        lst.add(name)
    foreign = lst.other_cursor()
    if foreign is not None:
        with pytest.raises(InvalidArgument, match="cursor"):
            lst.page(cursor=foreign)
    for limit in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgument, match="limit"):
            lst.page(limit=limit)


def test_every_app_pauses_come_first_in_an_apps_pause_pages() -> None:
    """An app's pause list is its own pauses and the job types paused in every app: two
    key ranges, read one after the other, a page across both."""
    with Quick.open("memory://") as q:
        q.pause(job_type="everywhere")
        q.pause("a", job_type="mail")
        q.pause("a", "t1")
        q.pause("b", "t1")
        first = q.pause_page("a", limit=2)
        assert [p.describe() for p in first.rows] == ["job_type=everywhere", "app=a job_type=mail"]
        last = q.pause_page("a", limit=2, cursor=first.next_cursor)
        assert [p.describe() for p in last.rows] == ["app=a tenant=t1"]
        assert last.next_cursor is None
        # Every app's list: the whole set, in key order, a page at a time.
        every = q.pause_page(None, limit=10)
        assert len(every.rows) == 4 and every.next_cursor is None
        assert [p.describe() for p in q.paused()] == [p.describe() for p in every.rows]


def test_the_whole_lists_still_read_everything() -> None:
    """q.weights(), q.tenant_limits(), q.paused() and TokenStore.list() keep returning
    the whole set (read a page at a time): admin figures and old callers."""
    with Quick.open("memory://") as q:
        for n in range(2500):
            q.set_weight("a", f"t{n:05d}", 2)
        assert len(q.weights()) == 2500
        tokens = TokenStore(q.kv, q.keys, q.clock)
        for _ in range(3):
            tokens.create("a", ["admin"])
        assert len(tokens.list()) == 3


def test_asyncquick_pages_the_same_lists() -> None:
    with Quick.open("memory://") as q:
        for n in range(3):
            q.set_weight("a", f"t{n}", 2)
            q.set_tenant_limit("a", f"t{n}", rate=1)
            q.pause("a", f"t{n}")
        aq = AsyncQuick(q)

        async def walk(page: Callable[..., Any]) -> None:
            first = await page("a", limit=2)
            assert [x.tenant for x in first.rows] == ["t0", "t1"]
            last = await page("a", limit=2, cursor=first.next_cursor)
            assert [x.tenant for x in last.rows] == ["t2"] and last.next_cursor is None

        for page in (aq.weight_page, aq.tenant_limit_page, aq.pause_page):
            asyncio.run(walk(page))

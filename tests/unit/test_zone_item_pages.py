"""Issue 43 point 2: a zone's items are read a page at a time from a cursor, with the
zone's count from its counter: a page reads what it shows, large items' payload chunks
are passed over, and paging shows each item once, in id order, while items come and go."""

from __future__ import annotations

import pytest

from quickzones.client import Quick
from quickzones.errors import InvalidArgument
from quickzones.store import admin
from quickzones.urls import open_kv
from tests.counting_kv import CountingKV


def _page_ids(q: Quick, limit: int, churn: Churn | None = None) -> list[str]:
    zone = q.zone("a", "t")
    out: list[str] = []
    cursor: str | None = None
    while True:
        _, page = admin.zone_item_page(q, zone, limit=limit, cursor=cursor)
        assert len(page.rows) <= limit
        out += [i.item_id for i in page.rows]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor
        if churn is not None:
            churn(q, out[-1])


class Churn:
    """Between two pages: an item comes behind the cursor, one ahead of it, and one ahead
    of it goes."""

    def __init__(self) -> None:
        self.ahead: set[str] = set()
        self.gone: set[str] = set()

    def __call__(self, q: Quick, last: str) -> None:
        at = int(last[1:5])
        q.enqueue("j", 1, app="a", tenant="t", item_id=f"i{at - 1:04d}x")
        q.enqueue("j", 1, app="a", tenant="t", item_id=f"i{at + 1:04d}x")
        self.ahead.add(f"i{at + 1:04d}x")
        victim = f"i{at + 4:04d}"
        if q.get("a", "t", victim) is not None:
            q.cancel("a", "t", victim)
            self.gone.add(victim)


def test_a_page_reads_what_it_shows_and_passes_over_chunks() -> None:
    kv = CountingKV(open_kv("memory://"))
    q = Quick(kv, max_payload=2_000_000)  # type: ignore[arg-type]
    for n in range(3000):
        q.enqueue("j", b"x" * (300_000 if n % 500 == 0 else 10), app="a", tenant="t",
                  item_id=f"i{n:04d}")  # fmt: skip
    zone = q.zone("a", "t")
    kv.keys_read = 0
    total, page = admin.zone_item_page(q, zone, limit=1)
    assert total == 3000 and [i.item_id for i in page.rows] == ["i0000"]
    assert kv.keys_read <= 10, kv.keys_read
    kv.keys_read = 0
    total, page = admin.zone_item_page(q, zone, limit=20, cursor=page.next_cursor)
    assert [i.item_id for i in page.rows] == [f"i{n:04d}" for n in range(1, 21)]
    assert kv.keys_read <= 30, kv.keys_read
    assert _page_ids(q, 97) == [f"i{n:04d}" for n in range(3000)]


def test_paging_while_items_come_and_go(q: Quick) -> None:
    originals = {f"i{n:04d}" for n in range(0, 200, 2)}
    for item_id in sorted(originals):
        q.enqueue("j", 1, app="a", tenant="t", item_id=item_id)
    churn = Churn()
    ids = _page_ids(q, 9, churn)
    assert len(ids) == len(set(ids)), "an item was shown twice"
    assert ids == sorted(ids)
    assert churn.gone and churn.ahead
    assert set(ids) == (originals - churn.gone) | churn.ahead


def test_a_bad_cursor_is_a_clear_error(q: Quick) -> None:
    q.enqueue("j", 1, app="a", tenant="t")
    for cursor in ("", "!!", "AAAA", "x" * 5000):
        with pytest.raises(InvalidArgument, match="cursor"):
            admin.zone_item_page(q, q.zone("a", "t"), cursor=cursor)

"""Completing an item that is gone says so as the docs promise (issue 41 point 15): a
retried completion whose first answer was lost finds the item completed already. Before,
the HTTP client raised a plain ``LeaseLost`` ("the item is gone: it was completed") where
docs/concepts.md promises ``ItemNotFound`` for an item that is gone. Now it is an
``ItemNotFound`` (``ItemGone``, still a ``LeaseLost`` for code written before), from
``complete`` and from ``complete_many`` alike, as the in-process store raises it."""

from __future__ import annotations

import pytest

from quickzones.adapters.http.client import RemoteQuick
from quickzones.errors import ItemNotFound, LeaseLost

from .conftest import Served


def test_completing_a_gone_item_is_item_not_found(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        rq.enqueue("job", 1, app="a", tenant="t1")
        [lease] = rq.lease(wait_s=2)
        rq.complete(lease)
        # The same completion sent again (its first answer lost on the way back).
        with pytest.raises(ItemNotFound) as err:
            rq.complete(lease)
        assert err.value.item_id == lease.item_id
        assert "completed" in str(err.value), str(err.value)  # says what became of it
        assert isinstance(err.value, LeaseLost)  # as before, for code that catches that

        rq.enqueue("job", 2, app="a", tenant="t2")
        [other] = rq.lease(wait_s=2)
        rq.complete(other)
        [outcome] = rq.complete_many([other])
        assert isinstance(outcome, ItemNotFound), outcome


def test_the_in_process_store_says_the_same(served: Served) -> None:
    """The same completion twice through the zone store: ItemNotFound there too."""
    q = served.q
    item_id = q.enqueue("job", 1, app="a", tenant="t3")
    with RemoteQuick(served.url, served.a_all) as rq:
        [lease] = rq.lease(wait_s=2)
        assert lease.item_id == item_id
        rq.complete(lease)
    from quickzones.store.records import ZoneId

    with pytest.raises(ItemNotFound):
        q.item_store().complete(ZoneId("a", "t3"), item_id, lease.lease_id)

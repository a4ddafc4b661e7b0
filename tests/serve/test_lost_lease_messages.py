"""Issue 28, point 11: a refused settle says what really happened to the lease: the item
was completed already, the lease id is wrong for a live lease, or the lease expired and
another consumer leased the item."""

from __future__ import annotations

import dataclasses
import time

import pytest

from quickzones.adapters.http.client import RemoteLease, RemoteQuick
from quickzones.errors import LeaseLost

from .conftest import Served


def _refusal(rq: RemoteQuick, lease: RemoteLease) -> str:
    with pytest.raises(LeaseLost) as err:
        rq.complete(lease)
    return str(err.value)


def test_a_refused_complete_says_what_happened(served: Served) -> None:
    with RemoteQuick(served.url, served.a_all) as rq:
        # Completed already (by this same consumer): not "held by someone else".
        rq.enqueue("job", 1, app="a", tenant="t1")
        [done] = rq.lease(wait_s=2)
        rq.complete(done)
        twice = _refusal(rq, done)
        assert "completed" in twice and "someone else" not in twice, twice
        assert "another consumer" not in twice, twice

        # A wrong lease id on a live lease: nothing expired, nobody else leased it.
        rq.enqueue("job", 2, app="a", tenant="t2")
        [live] = rq.lease(wait_s=2)
        wrong = dataclasses.replace(live, lease_id="0" * 32)
        said = _refusal(rq, wrong)
        assert "does not match" in said and "expired" not in said, said
        rq.complete(live)

        # Expired, and another consumer leased the item since.
        rq.enqueue("job", 3, app="a", tenant="t3")
        [first] = rq.lease(lease_s=0.2, wait_s=2)
        time.sleep(0.4)
        [again] = rq.lease(wait_s=2)
        assert again.item_id == first.item_id
        said = _refusal(rq, first)
        assert "expired" in said and "leased again" in said, said
        rq.complete(again)

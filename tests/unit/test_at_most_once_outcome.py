"""An at-most-once item whose handler raised is reported failed, never completed, and
keeps what its type's policy keeps (issue 28, point 10)."""

from __future__ import annotations

from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.registry import JobContext
from quickzones.store.outcomes import ResultNotAvailable


def test_an_at_most_once_item_whose_handler_raised_is_reported_failed(q: Quick) -> None:
    runs: list[Any] = []

    @q.job("charge_once", delivery="at_most_once", keep_status_s=600, dedupe_s=600)
    def charge_once(payload: Any, ctx: JobContext) -> None:
        runs.append(payload)
        raise RuntimeError("card declined")

    events: list[str] = []
    consumer = q.consumer(observer=lambda event, fields: events.append(event))
    item = q.enqueue("charge_once", 1, app="a", tenant="t", item_id="order-7")
    consumer.run_until_idle()
    status = q.status("a", "t", item)
    assert status is not None
    assert (status.state, status.error_count) == ("failed", 1)
    assert status.finished and "card declined" in (status.last_error or "")
    assert "failed" in events and "completed" not in events
    with pytest.raises(ResultNotAvailable, match="failed"):
        q.result("a", "t", item)
    # The dedupe window holds for a failed item too: it never runs twice.
    again = q.enqueue("charge_once", 1, app="a", tenant="t", item_id="order-7")
    assert again.duplicate == "failed"  # type: ignore[attr-defined]
    consumer.run_until_idle()
    assert runs == [1]


def test_an_at_most_once_item_keeps_its_result(q: Quick) -> None:
    @q.job("once", delivery="at_most_once", keep_result_s=600)
    def once(payload: Any, ctx: JobContext) -> Any:
        return {"ok": payload}

    item = q.enqueue("once", 2, app="a", tenant="t")
    q.run_until_idle()
    assert q.result("a", "t", item) == {"ok": 2}

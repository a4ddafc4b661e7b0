"""A job type's declared policy holds for every producer (issue 28, points 7 and 8).

The worker registers the handler; the web process that enqueues never imports it: a
second Quick on the same store (another process on the file backends)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.registry import JobContext
from quickzones.store.outcomes import DuplicateItemMismatch
from tests.conftest import store_url


def _worker(q: Quick, runs: list[Any]) -> None:
    """The worker process: its module (the handler and its type's policy), then its
    consumer's start, which stores the policy for producers without the handler."""

    @q.job("charge", dedupe_s=3600, keep_status_s=3600, keep_result_s=3600)
    def charge(payload: Any, ctx: JobContext) -> Any:
        runs.append(payload)
        return {"charged": payload["amount"]}

    q.consumer()


def test_dedupe_status_and_result_hold_for_a_producer_without_the_handler(q: Quick) -> None:
    runs: list[Any] = []
    _worker(q, runs)
    web = Quick(q.kv, clock=q.clock)  # the web process: no handler imported
    for _ in range(3):
        got = web.enqueue("charge", {"amount": 5}, app="billing", tenant="t", item_id="order-42")
        q.run_until_idle()
    assert runs == [{"amount": 5}]
    assert got.duplicate == "completed"  # type: ignore[attr-defined]
    status = web.status("billing", "t", "order-42")
    assert status is not None and status.state == "completed"
    assert web.result("billing", "t", "order-42") == {"charged": 5}


def test_at_most_once_and_ttl_of_the_type_hold_for_a_producer_without_it(q: Quick) -> None:
    @q.job("once", delivery="at_most_once", ttl_s=60)
    def once(payload: Any, ctx: JobContext) -> None: ...

    q.consumer()  # the worker starts
    web = Quick(q.kv, clock=q.clock)
    item_id = web.enqueue("once", 1, app="a", tenant="t")
    item = q.get("a", "t", item_id)
    assert item is not None and item.delivery == "at_most_once"
    assert item.deadline_ms == item.enqueued_ms + 60_000


def test_a_web_process_that_never_imports_the_handler(tmp_path: Path) -> None:
    url = store_url("sqlite", tmp_path)
    q = Quick.open(url)
    runs: list[Any] = []
    _worker(q, runs)
    code = (
        "import sys; from quickzones.client import Quick\n"
        "q = Quick.open(sys.argv[1])\n"
        "for _ in range(3):\n"
        "    print(q.enqueue('charge', {'amount': 5}, app='billing', tenant='t',"
        " item_id='order-42').duplicate)\n"
        "q.close()\n"
    )
    for _ in range(3):
        subprocess.run([sys.executable, "-c", code, url], check=True, timeout=60)
        q.run_until_idle()
    assert runs == [{"amount": 5}]
    assert q.result("billing", "t", "order-42") == {"charged": 5}
    q.close()


# --- point 8: a different job under a queued id is refused, never dropped ------------------


@pytest.mark.parametrize("typed", [False, True], ids=["no-policy", "dedupe-type"])
def test_a_different_job_under_a_queued_id_is_refused(q: Quick, typed: bool) -> None:
    if typed:
        _worker(q, [])
    job = "charge" if typed else "plain"
    first = q.enqueue(job, {"amount": 5}, app="a", tenant="t", item_id="x-1")
    assert first.duplicate is None  # type: ignore[attr-defined]
    again = q.enqueue(job, {"amount": 5}, app="a", tenant="t", item_id="x-1")
    assert again.duplicate == "queued"  # type: ignore[attr-defined]
    with pytest.raises(DuplicateItemMismatch, match="payload"):
        q.enqueue(job, {"amount": 6}, app="a", tenant="t", item_id="x-1")
    with pytest.raises(DuplicateItemMismatch, match="job type"):
        q.enqueue("refund", {"amount": 5}, app="a", tenant="t", item_id="x-1")
    item = q.get("a", "t", "x-1")
    assert item is not None and item.job_type == job and q.items.count(q.zone("a", "t")) == 1


def test_a_different_job_type_under_a_deduped_id_is_refused(q: Quick) -> None:
    _worker(q, [])
    q.enqueue("charge", {"amount": 5}, app="a", tenant="t", item_id="x-2")
    q.run_until_idle()
    with pytest.raises(DuplicateItemMismatch, match="job type"):
        q.enqueue("refund", {"amount": 5}, app="a", tenant="t", item_id="x-2")

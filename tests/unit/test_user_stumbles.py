"""Smaller stumbles of issue 28 point 18, each from the user's side: a result over 64 KiB
is refused with a clear error at completion (never dropped without a word), ``ctx.attempt``
agrees with ``status.attempts`` across nacks, and enqueue takes an absolute run-at time and
``timedelta`` delays."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import Nack
from quickzones.registry import JobContext
from quickzones.store.outcomes import MAX_RESULT_BYTES, ResultNotAvailable


def test_a_result_over_64_kib_is_refused_with_a_clear_error(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    q = Quick.open("memory://", clock=clock)
    runs: list[int] = []

    @q.job("report", keep_result_s=600)
    def report(payload: Any, ctx: JobContext) -> str:
        runs.append(1)
        return "x" * (100 * 1024)

    item_id = q.enqueue("report", {}, app="a", tenant="t")
    with caplog.at_level(logging.WARNING):
        q.run_until_idle()
    assert runs == [1]  # completed once, not retried for its result
    status = q.status("a", "t", item_id)
    assert status is not None and status.state == "completed" and not status.has_result
    [record] = [r for r in caplog.records if "result" in r.getMessage()]
    assert record.levelno == logging.WARNING
    for part in ("report", item_id, "a/t", "102402 bytes", str(MAX_RESULT_BYTES)):
        assert part in record.getMessage()
    with pytest.raises(ResultNotAvailable, match="102402 bytes"):
        q.result("a", "t", item_id)
    q.close()


def test_ctx_attempt_agrees_with_status_attempts_across_nacks(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    seen: list[tuple[int, int]] = []

    @q.job("poll", keep_status_s=600)
    def poll(payload: Any, ctx: JobContext) -> None:
        status = q.status(ctx.app, ctx.tenant, ctx.item_id)
        assert status is not None
        seen.append((ctx.attempt, status.attempts))
        if len(seen) < 4:
            raise Nack(1.0)

    item_id = q.enqueue("poll", {}, app="a", tenant="t")
    for _ in range(6):
        q.run_until_idle()
        clock.advance(1.5)
    assert seen == [(1, 1), (2, 2), (3, 3), (4, 4)]
    final = q.status("a", "t", item_id)
    assert final is not None and final.attempts == 4
    q.close()

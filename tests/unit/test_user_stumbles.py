"""Smaller stumbles of issue 28 point 18, each from the user's side: a result over 64 KiB
is refused with a clear error at completion (never dropped without a word), ``ctx.attempt``
agrees with ``status.attempts`` across nacks, and enqueue takes an absolute run-at time and
``timedelta`` delays."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from quickzones.aio import AsyncQuick
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import InvalidArgument, Nack
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


def _vesting(q: Quick, item_id: str) -> int:
    item = q.get("a", "t", item_id)
    assert item is not None
    return item.vesting_ms


def test_enqueue_takes_a_timedelta_delay_and_an_absolute_run_at(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    ran: list[str] = []

    @q.job("remind")
    def remind(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    now = datetime.fromtimestamp(clock.now(), tz=UTC)
    in_5_min = q.enqueue("remind", {}, app="a", tenant="t", delay=timedelta(minutes=5))
    at_noon = q.enqueue("remind", {}, app="a", tenant="t", run_at=now + timedelta(hours=1))
    paris = timezone(timedelta(hours=1))
    at_paris = q.enqueue(
        "remind", {}, app="a", tenant="t", run_at=(now + timedelta(hours=2)).astimezone(paris)
    )
    late = q.enqueue("remind", {}, app="a", tenant="t", run_at=now - timedelta(days=1))
    many = q.enqueue_many("remind", [1, 2], app="a", tenant="t", run_at=now + timedelta(hours=3))
    many_td = q.enqueue_many("remind", [3], app="a", tenant="t", delay=timedelta(seconds=90))
    start = int(clock.now() * 1000)
    assert _vesting(q, in_5_min) == start + 300_000
    assert _vesting(q, at_noon) == start + 3_600_000
    assert _vesting(q, at_paris) == start + 7_200_000
    assert _vesting(q, late) == start  # a time already past runs now
    assert {_vesting(q, i) for i in many} == {start + 10_800_000}
    assert _vesting(q, many_td[0]) == start + 90_000
    q.run_until_idle()
    assert ran == [late]
    clock.advance(3600)
    q.run_until_idle()
    assert set(ran) == {late, in_5_min, at_noon, many_td[0]}
    q.close()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"run_at": datetime(2030, 1, 1, 12, 0)}, "timezone"),
        ({"run_at": "2030-01-01T12:00:00Z"}, "datetime"),
        ({"run_at": datetime(2030, 1, 1, tzinfo=UTC), "delay": 5}, "not both"),
        ({"delay": timedelta(seconds=-1)}, "negative"),
        ({"delay": "5m"}, "seconds"),
    ],
    ids=["naive", "text", "both", "negative-timedelta", "text-delay"],
)
def test_bad_run_at_or_delay_is_refused_and_stores_nothing(
    clock: ManualClock, options: dict[str, Any], words: str
) -> None:
    q = Quick.open("memory://", clock=clock)
    with pytest.raises(InvalidArgument, match=words):
        q.enqueue("remind", {}, app="a", tenant="t", item_id="x", **options)
    with pytest.raises(InvalidArgument, match=words):
        q.enqueue_many("remind", [1], app="a", tenant="t", **options)
    assert q.get("a", "t", "x") is None and q.zones.count(q.zone("a", "t")) == 0
    q.close()


def test_async_enqueue_takes_run_at(clock: ManualClock) -> None:
    aq = AsyncQuick.open("memory://", clock=clock)
    run_at = datetime.fromtimestamp(clock.now(), tz=UTC) + timedelta(minutes=1)
    item_id = asyncio.run(aq.enqueue("remind", {}, app="a", tenant="t", run_at=run_at))
    assert _vesting(aq.quick, item_id) == int(clock.now() * 1000) + 60_000
    aq.quick.close()

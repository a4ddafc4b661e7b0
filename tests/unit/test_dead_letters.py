"""Dead letters keep the whole item, every filter filters, and a requeue moves the item back
all or nothing (issue 12 points 2, 3, 4, 14 and 17), on every KV backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from quickzones.aio import AsyncQuick
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ItemAlreadyQueued, PermanentError
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.records import DeadLetter, ZoneId
from tests.conftest import store_url

ZONES = [("a", "t1"), ("a", "t2"), ("b", "t1"), ("b", "t3")]
MIB = 1024 * 1024


def _kill_all(q: Quick, job_type: str = "doomed") -> None:
    @q.job(job_type)
    def doomed(payload: object, ctx: JobContext) -> None:
        raise PermanentError("no way")

    q.run_until_idle()


def _letters(q: Quick) -> None:
    for app, tenant in ZONES:
        q.enqueue("doomed", {"z": f"{app}/{tenant}"}, app=app, tenant=tenant, item_id="x")
    _kill_all(q)


def _zones_of(letters: list[DeadLetter]) -> set[tuple[str, str]]:
    return {(d.zone.app, d.zone.tenant) for d in letters}


FILTERS = [(None, None), ("a", None), (None, "t1"), ("a", "t1"), ("b", "t2"), (None, "t9")]


@pytest.mark.parametrize(("app", "tenant"), FILTERS)
def test_every_filter_filters_list_and_purge(q: Quick, app: str | None, tenant: str | None) -> None:
    _letters(q)
    want = {z for z in ZONES if app in (None, z[0]) and tenant in (None, z[1])}
    assert _zones_of(q.dead_letters(app, tenant)) == want
    assert q.purge_dead_letters(app, tenant) == len(want)
    assert _zones_of(q.dead_letters()) == set(ZONES) - want


@pytest.mark.parametrize(("app", "tenant"), FILTERS)
def test_async_filters(backend: str, tmp_path: Path, app: str | None, tenant: str | None) -> None:
    aq = AsyncQuick.open(store_url(backend, tmp_path), clock=ManualClock())
    try:
        _letters(aq.quick)
        want = {z for z in ZONES if app in (None, z[0]) and tenant in (None, z[1])}

        async def go() -> tuple[set[tuple[str, str]], int, set[tuple[str, str]]]:
            listed = _zones_of(await aq.dead_letters(app, tenant))
            purged = await aq.purge_dead_letters(app, tenant)
            return listed, purged, _zones_of(await aq.dead_letters())

        listed, purged, left = asyncio.run(go())
        assert listed == want and purged == len(want) and left == set(ZONES) - want
    finally:
        aq.quick.close()


def test_one_mib_payload_survives_dead_letter_and_requeue(q: Quick) -> None:
    payload = bytes(range(256)) * (MIB // 256)
    assert len(payload) == MIB
    got: list[bytes] = []

    @q.job("flaky", retry=RetryPolicy(max_attempts=1))
    def flaky(body: bytes, ctx: JobContext) -> None:
        got.append(body)
        if len(got) == 1:
            raise PermanentError("first time fails")

    item_id = q.enqueue("flaky", payload, app="a", tenant="t")
    q.run_until_idle()
    (letter,) = q.dead_letters("a", "t")
    assert letter.item is not None and letter.item.payload == payload
    assert q.requeue_dead_letter("a", "t", item_id) == item_id
    assert q.dead_letters() == []
    queued = q.get("a", "t", item_id)
    assert queued is not None and queued.payload == payload
    q.run_until_idle()
    assert got == [payload, payload]
    assert q.zones.count(ZoneId("a", "t")) == 0


def test_one_mib_json_payload_is_listed_decoded_requeued_and_run(q: Quick) -> None:
    text = "x" * (MIB - 100)
    calls: list[int] = []

    @q.job("flaky", retry=RetryPolicy(max_attempts=1))
    def flaky(payload: object, ctx: JobContext) -> None:
        calls.append(len(payload["t"]))  # type: ignore[index]
        if len(calls) == 1:
            raise PermanentError("first time fails")

    item_id = q.enqueue("flaky", {"t": text}, app="a", tenant="t")
    q.run_until_idle()
    (letter,) = q.dead_letters("a", "t")
    assert letter.item is not None
    assert json.loads(letter.item.payload) == {"t": text}
    q.requeue_dead_letter("a", "t", item_id)
    q.run_until_idle()
    assert calls == [len(text), len(text)]
    assert q.dead_letters() == []


def test_requeue_when_the_id_is_queued_changes_nothing_and_says_so(q: Quick) -> None:
    q.enqueue("doomed", {"n": 1}, app="a", tenant="t", item_id="same")
    _kill_all(q)
    q.enqueue("other", {"n": 2}, app="a", tenant="t", item_id="same")
    with pytest.raises(ItemAlreadyQueued) as info:
        q.requeue_dead_letter("a", "t", "same")
    assert info.value.item_id == "same"
    (letter,) = q.dead_letters("a", "t")  # the dead letter is kept
    assert letter.item is not None and json.loads(letter.item.payload) == {"n": 1}
    queued = q.get("a", "t", "same")
    assert queued is not None and queued.job_type == "other"
    assert q.zones.count(ZoneId("a", "t")) == 1


def test_dead_letter_counts_the_final_failure(q: Quick, clock: ManualClock) -> None:
    @q.job("fails", retry=RetryPolicy(max_attempts=3, inline_retries=0, backoff_base_s=0.0))
    def fails(payload: object, ctx: JobContext) -> None:
        raise RuntimeError("boom")

    q.enqueue("fails", None, app="a", tenant="t")
    for _ in range(10):
        q.run_until_idle()
        if q.dead_letters():
            break
        clock.advance(60)
    (letter,) = q.dead_letters()
    assert letter.item is not None
    assert letter.item.attempts == 3
    assert letter.item.error_count == letter.item.attempts
    assert letter.item.last_error is not None and "boom" in letter.item.last_error


def test_traceback_is_kept_in_the_dead_letter(q: Quick) -> None:
    zone = ZoneId("a", "t")
    item_id = q.enqueue("j", {"n": 1}, app="a", tenant="t")
    (item,) = q.zones.dequeue(zone, 1, 30_000)[0]
    tb = "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"
    q.zones.dead_letter(zone, item_id, item.lease_id, "RuntimeError: boom", traceback=tb)
    (letter,) = q.dead_letters()
    assert letter.traceback == tb and letter.reason == "RuntimeError: boom"

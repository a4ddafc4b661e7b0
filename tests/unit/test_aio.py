"""The asyncio API: the end-to-end behaviours of test_consumer.py with ``async def``
handlers, on every KV backend. Each test drives its own loop with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.aio import AsyncQuick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import ConfigurationError, Nack, PermanentError
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId
from tests.conftest import store_url

Z = ZoneId("app", "t1")


def arun(fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(fn())  # type: ignore[arg-type]


@pytest.fixture
def aq(backend: str, tmp_path: Path, clock: ManualClock) -> Iterator[AsyncQuick]:
    quick = AsyncQuick.open(store_url(backend, tmp_path), clock=clock)
    yield quick
    quick.quick.close()


@pytest.fixture
def raq(backend: str, tmp_path: Path) -> Iterator[AsyncQuick]:
    """Real time, for the threaded runtime."""
    quick = AsyncQuick.open(store_url(backend, tmp_path))
    yield quick
    quick.quick.close()


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return bool(cond())


# --- single-threaded draining (manual clock) ---------------------------------------------


def test_runs_every_item_of_every_tenant(aq: AsyncQuick) -> None:
    seen: list[tuple[str, Any]] = []
    loops: set[int] = set()

    @aq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        loops.add(id(asyncio.get_running_loop()))
        seen.append((ctx.tenant, payload["i"]))

    async def main() -> int:
        for t in range(5):
            await aq.enqueue_many("job", [{"i": i} for i in range(4)], app="app", tenant=f"t{t}")
        loops.add(id(asyncio.get_running_loop()))
        return await aq.run_until_idle()

    assert arun(main) == 20
    assert sorted(seen) == sorted((f"t{t}", i) for t in range(5) for i in range(4))
    assert len(loops) == 1  # every handler ran on the caller's loop
    assert all(aq.quick.zones.count(ZoneId("app", f"t{t}")) == 0 for t in range(5))


def test_transient_failure_backs_off_then_dead_letters(aq: AsyncQuick, clock: ManualClock) -> None:
    calls: list[int] = []

    @aq.job("flaky", retry=RetryPolicy(max_attempts=3, backoff_base_s=1, jitter=False))
    async def flaky(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("down")

    async def main() -> None:
        item_id = await aq.enqueue("flaky", b"", app="app", tenant="t1")
        await aq.run_until_idle()
        assert calls == [1]
        item = await aq.get("app", "t1", item_id)
        assert item is not None and item.error_count == 1 and "down" in (item.last_error or "")
        clock.advance(1.01)
        await aq.run_until_idle()
        clock.advance(2.01)
        await aq.run_until_idle()
        assert calls == [1, 2, 3]
        assert await aq.get("app", "t1", item_id) is None
        [dead] = await aq.dead_letters()
        assert dead.item_id == item_id and "down" in dead.reason
        await aq.requeue_dead_letter("app", "t1", item_id)
        assert await aq.dead_letters() == []

    arun(main)


def test_inline_retries_then_success(aq: AsyncQuick) -> None:
    calls: list[int] = []

    @aq.job("job", retry=RetryPolicy(inline_retries=2))
    async def job(payload: Any, ctx: JobContext) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("transient")

    async def main() -> None:
        await aq.enqueue("job", b"", app="app", tenant="t1")
        await aq.run_until_idle()

    arun(main)
    assert len(calls) == 3 and aq.quick.zones.count(Z) == 0


def test_permanent_error_dead_letters_at_once(aq: AsyncQuick) -> None:
    @aq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        raise PermanentError("bad input")

    async def main() -> None:
        await aq.enqueue("job", b"", app="app", tenant="t1")
        await aq.run_until_idle()
        [dead] = await aq.dead_letters("app", "t1")
        assert "bad input" in dead.reason

    arun(main)


def test_transactional_handler_commits_effects_with_completion(
    aq: AsyncQuick, clock: ManualClock
) -> None:
    fail = {"on": True}

    @aq.job("tx", transactional=True, retry=RetryPolicy(backoff_base_s=0.001, jitter=False))
    async def tx(payload: Any, ctx: JobContext) -> None:
        assert ctx.tr is not None
        ctx.tr.add(b"counter", (1).to_bytes(8, "little"))
        # An enqueue inside the handler joins its transaction.
        await aq.enqueue("follow_up", b"", app="app", tenant="t2", tr=ctx.tr)
        await asyncio.sleep(0)
        if fail["on"]:
            raise RuntimeError("after writing")

    async def main() -> None:
        await aq.enqueue("tx", b"", app="app", tenant="t1")
        await aq.run_until_idle()
        assert await aq.transact(lambda tr: tr.get(b"counter")) is None  # rolled back
        assert aq.quick.zones.count(ZoneId("app", "t2")) == 0
        fail["on"] = False
        clock.advance(1)
        await aq.run_until_idle()
        assert await aq.transact(lambda tr: tr.get(b"counter")) == (1).to_bytes(8, "little")
        assert aq.quick.zones.count(Z) == 0
        assert aq.quick.zones.count(ZoneId("app", "t2")) == 1

    arun(main)


def test_transactional_handler_with_lost_lease_has_no_effect(aq: AsyncQuick) -> None:
    @aq.job("tx", transactional=True)
    async def tx(payload: Any, ctx: JobContext) -> None:
        assert ctx.tr is not None
        ctx.tr.set(b"effect", b"1")

    async def main() -> None:
        item_id = await aq.enqueue("tx", b"", app="app", tenant="t1")
        consumer = aq.quick.consumer(ConsumerConfig(in_order=True))
        [ref] = await asyncio.to_thread(consumer.scan_once)
        [work] = await asyncio.to_thread(consumer.visit, ref)
        await aq.cancel("app", "t1", item_id)  # someone else takes the item away
        async with aq.consumer():  # binds this loop for the handler
            assert await asyncio.to_thread(consumer.execute, work) == "cancelled"
        assert await aq.transact(lambda tr: tr.get(b"effect")) is None

    arun(main)


def test_at_most_once_never_redelivered(aq: AsyncQuick, clock: ManualClock) -> None:
    calls: list[int] = []

    @aq.job("once", delivery="at_most_once")
    async def once(payload: Any, ctx: JobContext) -> None:
        calls.append(1)
        raise RuntimeError("fails")

    async def main() -> None:
        await aq.enqueue("once", b"", app="app", tenant="t1")
        await aq.run_until_idle()
        clock.advance(3600)
        await aq.run_until_idle()

    arun(main)
    assert calls == [1] and aq.quick.zones.count(Z) == 0


def test_nack_hands_item_back_with_delay_and_metadata(aq: AsyncQuick, clock: ManualClock) -> None:
    seen: list[dict[str, Any]] = []

    @aq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        seen.append(ctx.meta)
        if len(seen) == 1:
            raise Nack(delay_s=5, meta={"step": 2})

    async def main() -> None:
        item_id = await aq.enqueue("job", b"", app="app", tenant="t1")
        await aq.run_until_idle()
        item = await aq.get("app", "t1", item_id)
        assert item is not None and item.error_count == 0 and item.meta.get("step") == 2
        await aq.run_until_idle()
        assert len(seen) == 1
        clock.advance(5.01)
        await aq.run_until_idle()

    arun(main)
    assert seen == [{}, {"step": 2}] and aq.quick.zones.count(Z) == 0


def test_async_transaction_body_commits_user_writes_with_enqueue(aq: AsyncQuick) -> None:
    async def main() -> bytes | None:
        async def signup(tr: KVTransaction) -> bytes | None:
            tr.set(b"users/1", b"alice")
            await aq.enqueue("job", b"", app="app", tenant="t1", tr=tr)
            return await aq.run_sync(tr.get, b"users/1")

        return await aq.transact(signup)

    assert arun(main) == b"alice"
    assert aq.quick.zones.count(Z) == 1


def test_async_transaction_body_failure_commits_nothing(aq: AsyncQuick) -> None:
    async def main() -> None:
        async def body(tr: KVTransaction) -> None:
            await aq.enqueue("job", b"", app="app", tenant="t1", tr=tr)
            raise ValueError("abort")

        with pytest.raises(ValueError, match="abort"):
            await aq.transact(body)

    arun(main)
    assert aq.quick.zones.count(Z) == 0


def test_sync_handlers_mix_with_async_ones(aq: AsyncQuick) -> None:
    seen: list[str] = []
    aq.job("sync")(lambda payload, ctx: seen.append("sync"))

    @aq.job("async")
    async def job(payload: Any, ctx: JobContext) -> None:
        seen.append("async")

    async def main() -> None:
        await aq.enqueue("sync", b"", app="app", tenant="t1")
        await aq.enqueue("async", b"", app="app", tenant="t2")
        await aq.run_until_idle()

    arun(main)
    assert sorted(seen) == ["async", "sync"]


def test_plain_threaded_consumer_runs_async_handler_on_a_private_loop(aq: AsyncQuick) -> None:
    """``quick worker`` and Quick.run_until_idle know nothing of asyncio."""
    seen: list[int] = []

    @aq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0)
        seen.append(payload["i"])

    aq.quick.enqueue("job", {"i": 7}, app="app", tenant="t1")
    assert aq.quick.run_until_idle() == 1 and seen == [7]


def test_sync_drain_from_the_loop_thread_fails_clearly(aq: AsyncQuick) -> None:
    @aq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        pass

    async def main() -> None:
        await aq.enqueue("job", b"", app="app", tenant="t1")
        consumer = aq.quick.consumer(ConsumerConfig(in_order=True))
        [ref] = consumer.scan_once()
        [work] = consumer.visit(ref)
        with pytest.raises(ConfigurationError, match="run_until_idle"):
            aq.registry.get("job").call(JobContext(work.zone, work.item))

    arun(main)


# --- the threaded runtime under an async consumer (real time) ----------------------------


def test_async_consumer_runs_everything(raq: AsyncQuick) -> None:
    done: list[str] = []

    @raq.job("job", max_concurrency=4)
    async def job(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(0.001)
        done.append(ctx.item_id)

    async def main() -> set[str]:
        ids = set()
        for i in range(100):
            ids.add(await raq.enqueue("job", b"", app="app", tenant=f"t{i % 7}"))
        async with raq.consumer(ConsumerConfig(idle_sleep_s=0.005)):
            assert await wait_until(lambda: len(done) >= 100)
        return ids

    ids = arun(main)
    assert set(done) == ids


def test_run_consumer_until_stop_event(raq: AsyncQuick) -> None:
    done = []

    @raq.job("job")
    async def job(payload: Any, ctx: JobContext) -> None:
        done.append(1)

    async def main() -> None:
        stop = asyncio.Event()
        await raq.enqueue("job", b"", app="app", tenant="t1")
        task = asyncio.create_task(raq.run_consumer(ConsumerConfig(idle_sleep_s=0.005), stop=stop))
        assert await wait_until(lambda: bool(done))
        stop.set()
        await asyncio.wait_for(task, 10)
        # A cancelled run_consumer also stops gracefully.
        task = asyncio.create_task(raq.run_consumer(ConsumerConfig(idle_sleep_s=0.005)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    arun(main)
    assert done == [1]


def test_lost_lease_cancels_running_coroutine(raq: AsyncQuick) -> None:
    started = threading.Event()
    cancelled = threading.Event()

    @raq.job("slow")
    async def slow(payload: Any, ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main() -> None:
        item_id = await raq.enqueue("slow", b"", app="app", tenant="t1")
        config = ConsumerConfig(item_lease_s=0.6, lease_extend_s=0.3, idle_sleep_s=0.005)
        async with raq.consumer(config) as consumer:
            assert await wait_until(started.is_set)
            await raq.cancel("app", "t1", item_id)  # the next extension fails
            assert await wait_until(cancelled.is_set)
            assert await wait_until(lambda: consumer.stats["lease_lost"] >= 1)

    arun(main)


def test_lease_extended_while_coroutine_runs(raq: AsyncQuick) -> None:
    done = threading.Event()

    @raq.job("slow")
    async def slow(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(1.0)
        done.set()

    async def main() -> Any:
        await raq.enqueue("slow", b"", app="app", tenant="t1")
        config = ConsumerConfig(item_lease_s=0.4, lease_extend_s=0.2, idle_sleep_s=0.005)
        async with raq.consumer(config) as consumer:
            assert await wait_until(done.is_set)
            assert await wait_until(lambda: raq.quick.zones.count(Z) == 0)
        return consumer.stats

    stats = arun(main)
    assert stats["lease_extended"] >= 2
    assert stats["started"] == 1  # never ran twice


def test_execution_bound_cancels_and_requeues(raq: AsyncQuick) -> None:
    @raq.job("stuck", execution_bound_s=0.2, retry=RetryPolicy(backoff_base_s=60))
    async def stuck(payload: Any, ctx: JobContext) -> None:
        await asyncio.sleep(60)

    async def main() -> str:
        item_id = await raq.enqueue("stuck", b"", app="app", tenant="t1")
        config = ConsumerConfig(idle_sleep_s=0.005, lease_extend_s=0.1)
        async with raq.consumer(config) as consumer:
            assert await wait_until(lambda: consumer.stats["requeued"] >= 1)
        return item_id

    item_id = arun(main)
    item = raq.quick.get("app", "t1", item_id)
    assert item is not None and "execution bound" in (item.last_error or "")


def test_graceful_shutdown_cancels_and_gives_back_leases(raq: AsyncQuick) -> None:
    started = threading.Event()

    @raq.job("slow")
    async def slow(payload: Any, ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    async def main() -> str:
        item_id = await raq.enqueue("slow", b"", app="app", tenant="t1")
        config = ConsumerConfig(idle_sleep_s=0.005, shutdown_deadline_s=0.3)
        async with raq.consumer(config):
            assert await wait_until(started.is_set)
        return item_id

    item_id = arun(main)
    item = raq.quick.get("app", "t1", item_id)
    assert item is not None and item.lease_id is None and item.error_count == 0
    assert raq.quick.zones.peek(Z, 1)


def test_enqueue_many_lists_a_generator_on_the_loop_and_keeps_quicks_signature(
    aq: AsyncQuick,
) -> None:
    import inspect

    from quickzones.client import Quick

    threads: set[int] = set()

    def payloads() -> Iterator[dict[str, int]]:
        for n in range(3):
            threads.add(threading.get_ident())
            yield {"n": n}

    async def main() -> list[str]:
        return await aq.enqueue_many("job", payloads(), app="a", tenant="t", priority=1)

    ids = asyncio.run(main())
    assert len(ids) == 3 and threads == {threading.get_ident()}  # asyncio.run's thread
    assert aq.quick.zones.count(ZoneId("a", "t")) == 3
    # One signature, Quick's: the async twins list no keyword of their own.
    for name in ("enqueue", "enqueue_many", "enqueue_local"):
        assert inspect.signature(getattr(AsyncQuick, name)).parameters.keys() == (
            inspect.signature(getattr(Quick, name)).parameters.keys()
        ), name

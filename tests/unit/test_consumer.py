"""Consumers: scanner, managers and workers (paper Algorithms 1-3), invariants 4-9."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import PermanentError
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.kv import KVTransaction
from quickzones.store.records import ZoneId

Z = ZoneId("app", "t1")
IN_ORDER = ConsumerConfig(in_order=True)


def test_runs_every_item_of_every_tenant(q: Quick) -> None:
    seen: list[tuple[str, Any]] = []
    q.job("job")(lambda payload, ctx: seen.append((ctx.tenant, payload["i"])))
    for t in range(5):
        for i in range(4):
            q.enqueue("job", {"i": i}, app="app", tenant=f"t{t}")
    assert q.run_until_idle() == 20
    assert sorted(seen) == sorted((f"t{t}", i) for t in range(5) for i in range(4))
    assert all(q.zones.count(ZoneId("app", f"t{t}")) == 0 for t in range(5))


def test_one_visit_takes_at_most_dequeue_max(q: Quick) -> None:
    q.job("job")(lambda payload, ctx: None)
    for _ in range(25):
        q.enqueue("job", b"", app="app", tenant="t1")
    # processing_bound above dequeue_max: the visit, not the bound, is what is measured;
    # visit_max=dequeue_max: the paper's visits (the default's take a lone zone's free room).
    consumer = q.consumer(
        ConsumerConfig(in_order=True, dequeue_max=10, visit_max=10, processing_bound=20)
    )
    [ref] = consumer.scan_once()
    works = consumer.visit(ref)
    assert len(works) == 10  # invariant 7: water-filling
    for w in works:
        consumer.execute(w)
    assert q.zones.count(Z) == 15
    # The pointer was requeued at the zone's minimum vesting time: vested again now.
    assert len(consumer.scan_once()) == 1


def test_fairness_small_zone_not_stuck_behind_big_one(q: Quick) -> None:
    order: list[str] = []
    q.job("job")(lambda payload, ctx: order.append(ctx.tenant))
    q.enqueue_many("job", [b""] * 50, app="app", tenant="big")
    q.enqueue("job", b"", app="app", tenant="small")
    consumer = q.consumer(ConsumerConfig(in_order=True, dequeue_max=5))
    consumer.run_until_idle()
    assert order.index("small") <= 5


def test_transient_failure_backs_off_then_dead_letters(q: Quick, clock: ManualClock) -> None:
    calls = []

    @q.job("flaky", retry=RetryPolicy(max_attempts=3, backoff_base_s=1, jitter=False))
    def flaky(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("down")

    item_id = q.enqueue("flaky", b"", app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    consumer.run_until_idle()
    assert calls == [1]
    item = q.get("app", "t1", item_id)
    assert item is not None and item.error_count == 1 and "down" in (item.last_error or "")
    clock.advance(1.01)  # backoff 1 s, then 2 s
    consumer.run_until_idle()
    clock.advance(2.01)
    consumer.run_until_idle()
    assert calls == [1, 2, 3]
    assert q.get("app", "t1", item_id) is None
    [dead] = q.dead_letters()
    assert dead.item_id == item_id and "down" in dead.reason
    # Re-drive it.
    q.requeue_dead_letter("app", "t1", item_id)
    assert q.dead_letters() == [] and q.get("app", "t1", item_id) is not None


def test_inline_retries_then_success(q: Quick) -> None:
    calls = []

    @q.job("job", retry=RetryPolicy(inline_retries=2))
    def job(payload: Any, ctx: JobContext) -> None:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("transient")

    q.enqueue("job", b"", app="app", tenant="t1")
    q.run_until_idle()
    assert len(calls) == 3 and q.zones.count(Z) == 0


def test_permanent_error_dead_letters_at_once(q: Quick) -> None:
    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        raise PermanentError("bad input")

    q.enqueue("job", b"", app="app", tenant="t1")
    q.run_until_idle()
    [dead] = q.dead_letters("app", "t1")
    assert "bad input" in dead.reason and dead.item is not None


def test_unknown_job_type_is_kept_not_lost(q: Quick, clock: ManualClock) -> None:
    # Issue 15 point 4: left for a consumer that handles it, no attempt counted (it was
    # retried with an error before; tests/unit/test_routing.py has the rest).
    item_id = q.enqueue("unregistered", b"", app="app", tenant="t1")
    q.run_until_idle()
    item = q.get("app", "t1", item_id)
    assert item is not None and item.attempts == 0 and item.error_count == 0


def test_corrupt_record_goes_to_dead_letters_and_zone_keeps_flowing(q: Quick) -> None:
    """Invariant 8."""
    seen = []
    q.job("job")(lambda payload, ctx: seen.append(ctx.item_id))
    good = q.enqueue("job", b"", app="app", tenant="t1", priority=1)
    bad = q.enqueue("job", b"", app="app", tenant="t1", priority=0)
    tr = q.kv.create_transaction()
    tr.set(q.keys.item_key(Z, bad), b"\xc1 not msgpack")
    tr.commit()
    q.run_until_idle()
    assert seen == [good]
    [dead] = q.dead_letters()
    assert dead.item_id == bad and dead.item is None
    assert q.zones.count(Z) == 0


def test_transactional_handler_commits_effects_with_completion(q: Quick) -> None:
    """Invariant 9: exactly-once in KV mode."""
    fail = {"on": True}

    @q.job("tx", transactional=True, retry=RetryPolicy(backoff_base_s=0.001, jitter=False))
    def tx(payload: Any, ctx: JobContext) -> None:
        assert ctx.tr is not None
        ctx.tr.add(b"counter", (1).to_bytes(8, "little"))
        if fail["on"]:
            raise RuntimeError("after writing")

    q.enqueue("tx", b"", app="app", tenant="t1")
    q.run_until_idle()
    assert q.transact(lambda tr: tr.get(b"counter")) is None  # effects rolled back
    fail["on"] = False
    q.clock.sleep(1)  # type: ignore[attr-defined]
    q.run_until_idle()
    assert q.transact(lambda tr: tr.get(b"counter")) == (1).to_bytes(8, "little")
    assert q.zones.count(Z) == 0


def test_transactional_handler_with_lost_lease_has_no_effect(q: Quick) -> None:
    @q.job("tx", transactional=True)
    def tx(payload: Any, ctx: JobContext) -> None:
        assert ctx.tr is not None
        ctx.tr.set(b"effect", b"1")

    item_id = q.enqueue("tx", b"", app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    [work] = consumer.visit(ref)
    q.zones.cancel(Z, item_id)  # someone else takes the item away
    assert consumer.execute(work) == "cancelled"  # its start check: never started
    assert q.transact(lambda tr: tr.get(b"effect")) is None


def test_at_most_once_never_redelivered(q: Quick, clock: ManualClock) -> None:
    calls = []

    @q.job("once", delivery="at_most_once")
    def once(payload: Any, ctx: JobContext) -> None:
        calls.append(1)
        raise RuntimeError("fails")

    q.enqueue("once", b"", app="app", tenant="t1")
    q.run_until_idle()
    clock.advance(3600)
    q.run_until_idle()
    assert calls == [1] and q.zones.count(Z) == 0


def test_ttl_expired_item_dead_lettered_not_run(q: Quick, clock: ManualClock) -> None:
    calls = []
    q.job("job")(lambda payload, ctx: calls.append(1))
    q.enqueue("job", b"", app="app", tenant="t1", delay=10, ttl=5)
    clock.advance(11)
    q.run_until_idle()
    assert calls == []
    [dead] = q.dead_letters()
    assert dead.reason.startswith("expired")


def test_max_concurrency_per_job_type(q: Quick) -> None:
    q.job("limited", max_concurrency=2)(lambda payload, ctx: None)
    for _ in range(5):
        q.enqueue("limited", b"", app="app", tenant="t1")
    consumer = q.consumer(ConsumerConfig(in_order=True, dequeue_max=10))
    [ref] = consumer.scan_once()
    assert len(consumer.visit(ref)) == 2


# --- threaded runtime (real time) ----------------------------------------------------


@pytest.fixture
def rq(backend: str, tmp_path):  # type: ignore[no-untyped-def]
    from tests.conftest import store_url

    quick = Quick.open(store_url(backend, tmp_path))
    yield quick
    quick.close()


def wait_until(cond: Any, timeout: float = 10.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


@pytest.mark.parametrize("pipelined", [True, False])
def test_threaded_consumer_runs_everything(rq: Quick, pipelined: bool) -> None:
    done: list[str] = []
    lock = threading.Lock()

    @rq.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        with lock:
            done.append(ctx.item_id)

    ids = {rq.enqueue("job", b"", app="app", tenant=f"t{i % 7}") for i in range(200)}
    consumer = rq.consumer(ConsumerConfig(idle_sleep_s=0.005, pipelined_scans=pipelined))
    consumer.start()
    try:
        assert wait_until(lambda: len(done) >= 200)
    finally:
        consumer.stop()
    assert set(done) == ids


def test_lost_lease_interrupts_running_handler(rq: Quick) -> None:
    started, interrupted = threading.Event(), threading.Event()

    @rq.job("slow")
    def slow(payload: Any, ctx: JobContext) -> None:
        started.set()
        try:
            for _ in range(1000):
                time.sleep(0.01)
        except BaseException:
            interrupted.set()
            raise

    item_id = rq.enqueue("slow", b"", app="app", tenant="t1")
    consumer = rq.consumer(ConsumerConfig(item_lease_s=0.6, lease_extend_s=0.3, idle_sleep_s=0.005))
    consumer.start()
    try:
        assert started.wait(5)
        rq.cancel("app", "t1", item_id)  # the lease is gone: next extension fails
        assert interrupted.wait(5)
        assert wait_until(lambda: consumer.stats["lease_lost"] >= 1)
    finally:
        consumer.stop()


def test_lease_extended_while_handler_runs(rq: Quick) -> None:
    done = threading.Event()

    @rq.job("slow")
    def slow(payload: Any, ctx: JobContext) -> None:
        time.sleep(1.0)
        done.set()

    rq.enqueue("slow", b"", app="app", tenant="t1")
    consumer = rq.consumer(ConsumerConfig(item_lease_s=0.4, lease_extend_s=0.2, idle_sleep_s=0.005))
    consumer.start()
    try:
        assert done.wait(5)
        assert wait_until(lambda: rq.zones.count(Z) == 0)
    finally:
        consumer.stop()
    assert consumer.stats["lease_extended"] >= 2
    assert consumer.stats["started"] == 1  # never ran twice


def test_execution_bound_interrupts_and_requeues(rq: Quick) -> None:
    @rq.job("stuck", execution_bound_s=0.2, retry=RetryPolicy(backoff_base_s=60))
    def stuck(payload: Any, ctx: JobContext) -> None:
        while True:
            time.sleep(0.01)

    item_id = rq.enqueue("stuck", b"", app="app", tenant="t1")
    consumer = rq.consumer(ConsumerConfig(idle_sleep_s=0.005, lease_extend_s=0.1))
    consumer.start()
    try:
        assert wait_until(lambda: consumer.stats["requeued"] >= 1)
    finally:
        consumer.stop()
    item = rq.get("app", "t1", item_id)
    assert item is not None and "execution bound" in (item.last_error or "")


def test_graceful_shutdown_gives_back_leases(rq: Quick) -> None:
    started = threading.Event()

    @rq.job("slow")
    def slow(payload: Any, ctx: JobContext) -> None:
        started.set()
        while True:
            time.sleep(0.01)

    item_id = rq.enqueue("slow", b"", app="app", tenant="t1")
    consumer = rq.consumer(ConsumerConfig(idle_sleep_s=0.005, shutdown_deadline_s=0.3))
    consumer.start()
    assert started.wait(5)
    consumer.stop()
    item = rq.get("app", "t1", item_id)
    assert item is not None and item.lease_id is None and item.error_count == 0
    assert rq.zones.peek(Z, 1)  # vested again at once, for the next consumer


def test_enqueue_in_user_transaction_with_kv_helper(rq: Quick) -> None:
    def body(tr: KVTransaction) -> None:
        rq.enqueue("job", b"", app="app", tenant="t1", tr=tr)
        rq.enqueue("job", b"", app="app", tenant="t1", tr=tr)

    rq.transact(body)
    assert rq.zones.count(Z) == 2


def test_nack_hands_item_back_with_delay_and_metadata(q: Quick, clock: ManualClock) -> None:
    from quickzones.errors import Nack

    seen: list[dict[str, Any]] = []

    @q.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        seen.append(ctx.meta)
        if len(seen) == 1:
            raise Nack(delay_s=5, meta={"step": 2})

    item_id = q.enqueue("job", b"", app="app", tenant="t1")
    q.run_until_idle()
    item = q.get("app", "t1", item_id)
    assert item is not None and item.error_count == 0 and item.meta.get("step") == 2
    q.run_until_idle()
    assert len(seen) == 1  # not before its delay
    clock.advance(5.01)
    q.run_until_idle()
    assert seen == [{}, {"step": 2}] and q.zones.count(Z) == 0


def test_decisions_that_drop_or_delay_work_are_logged_once(
    q: Quick, caplog: pytest.LogCaptureFixture
) -> None:
    @q.job("job", retry=RetryPolicy(max_attempts=1))
    def job(payload: Any, ctx: JobContext) -> None:
        raise RuntimeError("secret-free reason")

    q.enqueue("job", b"do-not-log-this-payload", app="app", tenant="t1")
    with caplog.at_level("INFO", logger="quick.consumer"):
        q.run_until_idle()
    events = [r.quick_event for r in caplog.records if hasattr(r, "quick_event")]  # type: ignore[attr-defined]
    assert events.count("dead_lettered") == 1
    assert "do-not-log-this-payload" not in caplog.text
    assert "secret-free reason" in caplog.text


def test_one_consumer_polls_several_clusters(clock: ManualClock) -> None:
    east = Quick.open("memory://", clock=clock, cluster="east", shards=2)
    west = Quick.open("memory://", clock=clock, cluster="west")
    ran: list[tuple[str, str]] = []

    @east.job("job")
    def job(payload: Any, ctx: JobContext) -> None:
        ran.append((payload["where"], ctx.tenant))

    @east.job("tx", transactional=True)
    def tx(payload: Any, ctx: JobContext) -> None:
        assert ctx.tr is not None
        ctx.tr.set(b"effect/" + ctx.tenant.encode(), b"1")

    for i in range(6):
        east.enqueue("job", {"where": "east"}, app="a", tenant=f"e{i}")
        west.enqueue("job", {"where": "west"}, app="a", tenant=f"w{i}")
    west.enqueue("tx", b"", app="a", tenant="wt")
    consumer = east.consumer(ConsumerConfig(in_order=True), also=[west])
    assert consumer.run_until_idle() == 13
    assert sorted(w for w, _ in ran) == ["east"] * 6 + ["west"] * 6
    # The transactional handler's effect committed in the item's own cluster.
    assert west.transact(lambda tr: tr.get(b"effect/wt")) == b"1"
    assert east.transact(lambda tr: tr.get(b"effect/wt")) is None


def test_consumer_applies_its_delivery_and_ttl_to_unaware_producers(
    backend: str, tmp_path: Any, clock: ManualClock
) -> None:
    """A producer that does not import the handlers still gets the job type's at-most-once
    delivery and TTL, because the consumer applies them at dequeue."""
    import uuid

    from tests.conftest import store_url

    url = store_url(backend, tmp_path)
    if backend in ("memory", "fdbsim"):  # two handles on one in-process store
        url = f"{backend}://delivery-{uuid.uuid4().hex}"
    producer = Quick.open(url, clock=clock)
    consumer_side = Quick.open(url, clock=clock)
    calls: list[str] = []

    @consumer_side.job("once", delivery="at_most_once")
    def once(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.item_id)
        raise RuntimeError("fails after the delete")

    consumer_side.job("short", ttl_s=5)(lambda payload, ctx: calls.append("short"))
    producer.enqueue("once", b"", app="app", tenant="t1")
    producer.enqueue("short", b"", app="app", tenant="t1", delay=10)
    consumer_side.run_until_idle()
    clock.advance(3600)
    consumer_side.run_until_idle()
    assert len(calls) == 1 and "short" not in calls  # never redelivered; expired unrun
    assert next(d.reason for d in consumer_side.dead_letters()).startswith("expired")

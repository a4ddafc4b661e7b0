"""Issue 12, "nothing lost, nothing stuck": the consumer's side (points 1, 6, 7, 8, 13,
14, 17, 18, 19)."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.interrupt import LeaseInterrupted, interrupt_thread
from quickzones.consumer.pool import DaemonPool
from quickzones.errors import LeaseLost
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.kv import COMMIT_UNKNOWN_RESULT, KVError, KVTransaction
from quickzones.store.records import ZoneId
from tests.waiting import wait_for

Z = ZoneId("app", "t1")
IN_ORDER = ConsumerConfig(in_order=True)


# --- point 1: at-most-once items are deleted only when their handler starts -------------


def test_at_most_once_refused_by_pool_cap_is_given_back(q: Quick) -> None:
    seen: list[str] = []
    q.job("once", delivery="at_most_once", pool_max_concurrency=1)(
        lambda payload, ctx: seen.append(ctx.item_id)
    )
    ids = {q.enqueue("once", b"", app="a", tenant=f"t{i}") for i in range(2)}
    a = q.consumer(IN_ORDER, name="a")
    b = q.consumer(IN_ORDER, name="b")
    works = [w for ref in a.scan_once() for w in a.visit(ref)]
    assert len(works) == 2
    assert b._slots.acquire("type", "once", 1, 1) == 1  # another consumer holds the slot
    assert [a.execute(w) for w in works] == ["released", "released"] and seen == []
    b._slots.release("type", "once", 1)
    q.clock.sleep(1)  # type: ignore[attr-defined]
    a.run_until_idle()
    assert set(seen) == ids and len(seen) == 2


def test_at_most_once_given_back_on_stop_before_start(q: Quick) -> None:
    seen: list[str] = []
    q.job("once", delivery="at_most_once")(lambda payload, ctx: seen.append(ctx.item_id))
    item_id = q.enqueue("once", b"", app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    [work] = consumer.visit(ref)
    consumer._stopping.set()
    consumer._workers = object()  # type: ignore[assignment]  # as in a threaded stop
    assert consumer.execute(work) == "released"
    item = q.get("app", "t1", item_id)
    assert item is not None and item.lease_id is None and seen == []
    q.run_until_idle()
    assert seen == [item_id] and q.get("app", "t1", item_id) is None


def test_stop_gives_back_items_waiting_behind_a_stuck_handler() -> None:
    """A handler blocked in a C call ignores the shutdown interrupt and holds the only
    worker: the items queued behind it are given back at stop, not left leased."""
    q = Quick.open(f"memory://stuck-{uuid.uuid4().hex}")
    release = threading.Event()
    started = threading.Event()

    @q.job("b", delivery="at_most_once")
    def b(payload: Any, ctx: JobContext) -> None:
        started.set()
        release.wait(30)  # a blocking call: the interrupt lands only when it returns

    ids = [q.enqueue("b", b"", app="app", tenant="t1") for _ in range(4)]
    # A prefetch of 3 beyond the one worker: items wait behind the stuck handler.
    consumer = q.consumer(ConsumerConfig(in_order=True, workers=1, processing_bound=4))
    consumer.start()
    try:
        assert started.wait(20)
        assert wait_for(lambda: consumer.in_flight() == 4, 20)
        consumer.stop(0.5)
        left = [q.get("app", "t1", i) for i in ids]
        present = [item for item in left if item is not None]
        assert len(present) == 3  # the started one is gone (at most once), none lost
        assert all(item.lease_id is None for item in present)  # free to run at once
    finally:
        release.set()
        q.close()


# --- point 6: a transactional handler and its own lease extender ------------------------


@pytest.mark.parametrize("backend_name", ["memory", "sqlite"])
def test_transactional_handler_not_livelocked_by_its_lease_extender(
    backend_name: str, tmp_path: Path
) -> None:
    url = (
        f"memory://tx-{uuid.uuid4().hex}"
        if backend_name == "memory"
        else f"sqlite:///{tmp_path / 'tx.db'}"
    )
    q = Quick.open(url)
    runs: list[int] = []

    @q.job("tx", transactional=True)
    def tx(payload: Any, ctx: JobContext) -> None:
        runs.append(1)
        assert ctx.tr is not None
        key = b"effect-" + ctx.item_id.encode()
        ctx.tr.set(key, b"%d" % (int(ctx.tr.get(key) or b"0") + 1))  # its read version: now
        time.sleep(0.8)  # past the extension point (0.3 s into a 1 s lease)

    item_id = q.enqueue("tx", b"", app="app", tenant="t1")
    consumer = q.consumer(
        ConsumerConfig(in_order=True, item_lease_s=1.0, lease_extend_s=0.3, workers=1)
    )
    consumer.start()
    try:
        done = wait_for(lambda: q.get("app", "t1", item_id) is None, timeout=20)
    finally:
        consumer.stop(5)
    assert done, f"never committed after {len(runs)} runs"
    assert len(runs) == 1
    assert q.transact(lambda tr: tr.get(b"effect-" + item_id.encode())) == b"1"
    q.close()


# --- point 7: SystemExit / KeyboardInterrupt in a handler -------------------------------


@pytest.mark.parametrize("exc", [SystemExit, KeyboardInterrupt])
def test_handler_raising_base_exception_counts_toward_max_attempts(
    exc: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    q = Quick.open(f"memory://exit-{uuid.uuid4().hex}")
    calls: list[int] = []

    @q.job("bye", retry=RetryPolicy(max_attempts=2, backoff_base_s=0.01, jitter=False))
    def bye(payload: Any, ctx: JobContext) -> None:
        calls.append(ctx.attempt)
        raise exc("leaving")

    item_id = q.enqueue("bye", b"", app="app", tenant="t1")
    consumer = q.consumer(ConsumerConfig(in_order=True, workers=1))
    with caplog.at_level(logging.WARNING, logger="quick"):
        consumer.start()
        try:
            wait_for(lambda: bool(q.dead_letters()), timeout=30)
        finally:
            consumer.stop(5)
    [dead] = q.dead_letters()
    assert dead.item_id == item_id and exc.__name__ in dead.reason
    assert calls == [1, 2]
    assert exc.__name__ in caplog.text  # with a trace, not silently
    q.close()


# --- point 8: an interrupt reaches only the invocation it was meant for -----------------


def test_idle_worker_thread_survives_a_stray_interrupt() -> None:
    pool = DaemonPool(1, "t-pool")
    ids: list[int] = []
    ran = threading.Event()
    pool.post(lambda: ids.append(threading.get_ident()))
    assert wait_for(lambda: bool(ids), 10)
    time.sleep(0.05)  # back in its queue wait
    interrupt_thread(ids[0], LeaseInterrupted)
    pool.post(ran.set)
    pool.post(ran.set)  # the first wakes it (and the interrupt lands); the second runs
    assert ran.wait(10)
    assert pool.shutdown(time.monotonic() + 10)


def test_late_lease_lost_interrupt_does_not_hit_the_next_item(
    q: Quick, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    go1, h1_running, h2_running, go2 = (threading.Event() for _ in range(4))
    interrupted: list[str] = []

    @q.job("j")
    def handler(payload: Any, ctx: JobContext) -> None:
        if payload["n"] == 1:
            h1_running.set()
            go1.wait(10)
            return
        h2_running.set()
        try:
            end = time.monotonic() + 10
            while not go2.is_set() and time.monotonic() < end:
                time.sleep(0.01)
        except LeaseInterrupted:
            interrupted.append("h2")
            raise

    q.enqueue("j", {"n": 1}, app="app", tenant="t1")
    q.enqueue("j", {"n": 2}, app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    # Same enqueue time: the order is by random item id. Item 1 runs first.
    w1, w2 = sorted(consumer.visit(ref), key=lambda w: json.loads(w.item.payload)["n"])
    store = consumer.clusters[consumer.toplevel.cluster].zones
    real_extend = store.extend_lease
    called = threading.Event()

    def slow_lost_extend(zone: ZoneId, item_id: str, lease_id: str, lease_ms: int) -> Any:
        if item_id != w1.item.item_id:
            return real_extend(zone, item_id, lease_id, lease_ms)
        called.set()
        h2_running.wait(10)  # the verdict arrives after handler 1 returned
        raise LeaseLost(item_id)

    monkeypatch.setattr(store, "extend_lease", slow_lost_extend)
    outcomes: list[str] = []

    def worker() -> None:
        outcomes.append(consumer.execute(w1))
        outcomes.append(consumer.execute(w2))

    t = threading.Thread(target=worker)
    t.start()
    assert h1_running.wait(10)
    clock.advance(11)  # item 1 is due for an extension; item 2 is still far from expiry
    extender = threading.Thread(target=consumer.extend_leases_once)
    extender.start()
    assert called.wait(10)
    go1.set()
    extender.join(10)
    time.sleep(0.1)
    go2.set()
    t.join(10)
    assert not t.is_alive()
    assert interrupted == []
    assert outcomes[1] == "completed"


# --- point 13: per-consumer max_concurrency with several managers -----------------------


def test_max_concurrency_holds_across_concurrent_visits(
    q: Quick, monkeypatch: pytest.MonkeyPatch
) -> None:
    q.job("one", max_concurrency=1)(lambda payload, ctx: None)
    q.enqueue("one", b"", app="app", tenant="t1")
    q.enqueue("one", b"", app="app", tenant="t2")
    consumer = q.consumer(IN_ORDER)
    refs = consumer.scan_once()
    assert len(refs) == 2
    real_accept = consumer._accept
    barrier = threading.Barrier(2, timeout=10)

    def accept_together(reserved: dict[str, str]) -> Callable[[Any], bool]:
        inner = real_accept(reserved)

        def accept(item: Any) -> bool:
            admitted = inner(item)
            barrier.wait()  # both managers decide before either visit hands its items over
            return admitted

        return accept

    monkeypatch.setattr(consumer, "_accept", accept_together)
    taken: list[int] = []
    threads = [
        threading.Thread(target=lambda r=ref: taken.append(len(consumer.visit(r)))) for ref in refs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(taken) == [0, 1]


def test_max_concurrency_one_with_default_managers_end_to_end() -> None:
    q = Quick.open(f"memory://cap-{uuid.uuid4().hex}")
    lock = threading.Lock()
    running = [0]
    peak = [0]
    done: list[str] = []

    @q.job("one", max_concurrency=1)
    def one(payload: Any, ctx: JobContext) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
            done.append(ctx.item_id)

    for i in range(24):
        q.enqueue("one", b"", app="app", tenant=f"t{i % 8}")
    consumer = q.consumer(ConsumerConfig(in_order=True))  # 4 managers, 8 workers
    consumer.start()
    try:
        assert wait_for(lambda: len(done) == 24, 60)
    finally:
        consumer.stop(5)
        q.close()
    assert peak[0] == 1


# --- point 17: a redelivery after a crash is a lapse, not an attempt -------------------


def _crash_mid_run(q: Quick, clock: ManualClock) -> None:
    """A consumer leases the item and starts its run, then its process dies."""
    dying = q.consumer(IN_ORDER)
    works = [w for ref in dying.scan_once() for w in dying.visit(ref)]
    assert works
    for w in works:
        q.zones.start(w.zone, w.item.item_id, w.item.lease_id or "")
    clock.advance(31)  # past the 30 s item lease


def test_redelivery_after_crash_counts_a_lapse_not_an_attempt(q: Quick, clock: ManualClock) -> None:
    attempts: list[int] = []
    q.job("crashy", retry=RetryPolicy(max_attempts=3, max_lapses=3))(
        lambda payload, ctx: attempts.append(ctx.attempt)
    )
    item_id = q.enqueue("crashy", b"", app="app", tenant="t1")
    for _ in range(2):
        _crash_mid_run(q, clock)
    q.consumer(IN_ORDER).run_until_idle()
    assert attempts == [1]  # the two crashed runs were lapses, not attempts
    assert q.dead_letters() == []  # two lapses: no failure counted, the run went on

    crash_id = q.enqueue("crashy", b"", app="app", tenant="t2")
    for _ in range(3):
        _crash_mid_run(q, clock)
    q.consumer(IN_ORDER).run_until_idle()
    assert attempts == [1]  # not run again: its crashes used up max_lapses
    [dead] = q.dead_letters()
    assert dead.item_id == crash_id and "lapsed 3 times, never released" in dead.reason
    assert q.get("app", "t1", item_id) is None


# --- point 18: an unknown job type is reported --------------------------------------------


def test_unknown_job_type_warned_once_per_type_and_counted(
    q: Quick, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(3):
        q.enqueue("nobody-handles-me", b"", app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    with caplog.at_level(logging.WARNING, logger="quick"):
        consumer.run_until_idle()
        clock.advance(5)
        consumer.run_until_idle()
    warned = [r for r in caplog.records if "nobody-handles-me" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert consumer.stats["unknown_job_type"] >= 3


def test_unknown_job_type_has_a_prometheus_counter() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from quickzones.consumer.metrics import PrometheusObserver

    reg = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(reg)
    observer("unknown_job_type", {"zone": Z, "job_type": "nope", "item_id": "x"})
    value = reg.get_sample_value("quick_unknown_job_type_total", {"job_type": "nope"})
    assert value == 1


# --- point 19: a maybe-committed transactional completion ----------------------------------


def test_transactional_completion_applied_despite_unknown_result_counts_completed(
    q: Quick,
) -> None:
    runs: list[int] = []

    @q.job("tx", transactional=True)
    def tx(payload: Any, ctx: JobContext) -> None:
        runs.append(1)
        assert ctx.tr is not None
        ctx.tr.set(b"effect", b"1")

    item_id = q.enqueue("tx", b"", app="app", tenant="t1")
    consumer = q.consumer(IN_ORDER)
    [ref] = consumer.scan_once()
    [work] = consumer.visit(ref)
    real = q.kv.create_transaction
    armed = [True]

    def lying() -> KVTransaction:
        tr = real()
        commit = tr.commit

        def commit_then_unknown() -> None:
            commit()
            if armed[0] and runs:
                armed[0] = False
                raise KVError(COMMIT_UNKNOWN_RESULT, "injected: applied")

        tr.commit = commit_then_unknown  # type: ignore[method-assign]
        return tr

    q.kv.create_transaction = lying  # type: ignore[method-assign]
    assert consumer.execute(work) == "completed"
    assert runs == [1]
    assert consumer.stats["completed"] == 1 and consumer.stats["lease_lost"] == 0
    assert q.get("app", "t1", item_id) is None


# --- point 14: failures shown with their traceback ----------------------------------------


def test_format_failure_is_bounded_and_keeps_both_ends() -> None:
    from quickzones.consumer.failure_log import format_failure

    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("the real cause " + "x" * 50_000)
        deep(n - 1)

    try:
        deep(200)
    except ValueError as err:
        text = format_failure(err, max_lines=40, max_bytes=4096)
    assert len(text.splitlines()) <= 41 and len(text.encode()) <= 4096
    assert "ValueError: the real cause" in text or "xxxx" in text.splitlines()[-1]
    assert text.splitlines()[-1].endswith("x")  # the end (what failed) is kept

    try:
        deep(3)
    except ValueError as err:
        short = format_failure(err)
    assert short.startswith("Traceback") and "in deep" in short


def test_handler_failure_logged_once_at_warning_with_traceback(
    q: Quick, caplog: pytest.LogCaptureFixture
) -> None:
    def charge_card(payload: Any) -> None:
        raise RuntimeError("card declined 4242")

    q.job("pay", retry=RetryPolicy(inline_retries=1))(lambda payload, ctx: charge_card(payload))
    q.enqueue("pay", b"", app="app", tenant="t1")
    with caplog.at_level(logging.WARNING, logger="quick"):
        q.consumer(IN_ORDER).run_until_idle()
    logged = [r for r in caplog.records if "card declined 4242" in r.getMessage()]
    assert len(logged) == 2  # two attempts (one inline retry), each logged once
    assert all(r.levelno == logging.WARNING for r in logged)
    assert all("Traceback" in r.getMessage() and "charge_card" in r.getMessage() for r in logged)


def test_failure_log_rate_limited_per_job_type() -> None:
    from quickzones.consumer.failure_log import FailureLog

    now = [0.0]
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger(f"quick.test.{uuid.uuid4().hex}")
    logger.addHandler(Collect())
    logger.propagate = False
    flog = FailureLog(logger, burst=5, window_s=60, monotonic=lambda: now[0])
    shown = [flog.failed("a", f"i{n}", "z", 1, "Traceback ...") for n in range(12)]
    assert shown.count(True) == 5
    assert flog.failed("b", "j", "z", 1, "Traceback ...")  # another type is not limited
    now[0] = 61
    assert flog.failed("a", "i12", "z", 1, "Traceback ...")
    assert "7 earlier failures" in records[-1]
    assert len(records) == 7


def test_app_module_import_error_names_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quickzones.cli import load_handlers
    from quickzones.errors import HandlerImportError

    name = f"broken_handlers_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text("import os\n\nvalue = undefined_name + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HandlerImportError) as info:
        load_handlers(name)
    assert f"{path}, line 3" in str(info.value) and "undefined_name" in str(info.value)


def test_dead_letter_keeps_the_handlers_traceback(q: Quick) -> None:
    def charge_card(payload: Any) -> None:
        raise RuntimeError("card declined 4242")

    q.job("pay", retry=RetryPolicy(max_attempts=1))(lambda payload, ctx: charge_card(payload))
    q.enqueue("pay", b"", app="app", tenant="t1")
    q.consumer(IN_ORDER).run_until_idle()
    (letter,) = q.dead_letters(app="app", tenant="t1")
    assert letter.traceback is not None
    assert "Traceback" in letter.traceback and "charge_card" in letter.traceback
    assert "RuntimeError: card declined 4242" in letter.traceback

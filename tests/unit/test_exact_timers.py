"""Issue 15 point 5: exact timers. An idle consumer sleeps until the earliest vesting time
it saw (at most ``idle_sleep_s``), and a local enqueue wakes it; idle, it polls no more
than before. Lateness itself is measured by bench/delayed_lateness.py, not asserted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.selection import longest_wait_ms
from quickzones.errors import ConfigurationError, Nack, PermanentError
from quickzones.registry import JobContext
from tests.conftest import HAVE_POSTGRES, store_url
from tests.other_process import enqueue_from_another_process
from tests.waiting import wait_for


def recorder(q: Quick) -> list[tuple[str, float]]:
    """Handler 'timed' records (item id, ms after its vesting time it started)."""
    started: list[tuple[str, float]] = []

    def timed(payload: Any, ctx: JobContext) -> None:
        started.append((ctx.item_id, time.time() * 1000 - ctx.item.enqueued_ms - payload))

    q.job("timed")(timed)
    return started


def test_peek_tells_the_earliest_vesting_time_not_yet_vested(q: Quick, clock: ManualClock) -> None:
    q.enqueue("j", b"", app="a", tenant="later", delay=5)
    q.enqueue("j", b"", app="a", tenant="latest", delay=9)
    now = int(clock.now() * 1000)
    assert q.toplevel.peek(0, 10) == ([], now + 5000)
    q.enqueue("j", b"", app="a", tenant="now")
    refs, later = q.toplevel.peek(0, 10)
    assert len(refs) == 1 and later == now + 5000
    assert q.toplevel.peek(0, 1) == (refs, now + 5000)
    clock.advance(10)
    refs, later = q.toplevel.peek(0, 10)
    assert len(refs) == 3 and later is None


def test_peek_looks_for_the_next_vesting_time_no_further_than_asked(
    q: Quick, clock: ManualClock
) -> None:
    """``ahead_ms`` bounds the look past the horizon, on every store alike: a pointer
    vesting later is not told, and the vested ones are all still there."""
    q.enqueue("j", b"", app="a", tenant="now")
    q.enqueue("j", b"", app="a", tenant="later", delay=5)
    now = int(clock.now() * 1000)
    refs, later = q.toplevel.peek(0, 10, ahead_ms=4_999)
    assert len(refs) == 1 and later is None
    assert q.toplevel.peek(0, 10, ahead_ms=5_000) == (refs, now + 5000)
    assert q.toplevel.peek(0, 10, horizon_ms=1_000, ahead_ms=4_000) == (refs, now + 5000)
    assert q.toplevel.peek(0, 10, horizon_ms=1_000, ahead_ms=3_999) == (refs, None)


def test_a_scan_remembers_the_next_vesting_time_within_its_longest_sleep(
    q: Quick, clock: ManualClock
) -> None:
    """The scanner remembers when the next pointer vests where that is within its
    longest sleep (it sleeps until then); one later it does not look for (it scans again
    at its longest sleep anyway, then sees it)."""
    config = ConsumerConfig(in_order=False)
    consumer = q.consumer(config)
    assert consumer.scan_once() == [] and consumer.scanner.next_vesting_ms is None
    longest = longest_wait_ms(config)
    assert longest == 1668  # a third of election_ttl_s (5 s), where commits wake it
    q.enqueue("j", b"", app="a", tenant="far", delay=2)
    assert consumer.scan_once() == [] and consumer.scanner.next_vesting_ms is None
    assert consumer.scanner.until_next_vesting(cap_s=longest / 1000) == longest / 1000
    q.enqueue("j", b"", app="a", tenant="near", delay=1)
    assert consumer.scan_once() == []
    assert consumer.scanner.next_vesting_ms == int(clock.now() * 1000) + 1000
    clock.advance(1.5)  # the far one is now 0.5 s away: seen, slept until
    consumer.scan_once()
    assert consumer.scanner.next_vesting_ms == int(clock.now() * 1000) + 500


def test_delayed_item_starts_on_its_timer_not_early_and_not_by_polling(real_q: Quick) -> None:
    started = recorder(real_q)
    # The idle poll is far longer than the test: only the timer can start the items.
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60, workers=2))
    consumer.start()
    try:
        ids = [
            real_q.enqueue("timed", ms, app="a", tenant=f"t{ms}", delay=ms / 1000)
            for ms in (300, 600, 900)
        ]
        assert wait_for(lambda: len(started) == 3)
        scans = consumer.stats["scan"]
    finally:
        consumer.stop(5)
    assert sorted(i for i, _ in started) == sorted(ids)
    assert all(late >= 0 for _, late in started), started  # none started early
    # A scan per enqueue wake-up, per timer and per visit's follow-up: no polling.
    assert scans <= 20, scans


def test_local_enqueue_wakes_an_idle_consumer(real_q: Quick) -> None:
    ran = threading.Event()
    real_q.job("j")(lambda payload, ctx: ran.set())
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        time.sleep(0.3)  # idle: no scan while it sleeps
        idle_scans = consumer.stats["scan"]
        real_q.enqueue("j", b"", app="a", tenant="t")
        assert ran.wait(20)  # long before the 60 s poll
    finally:
        consumer.stop(5)
    assert idle_scans <= 2, idle_scans


def test_idle_consumer_polls_no_more_than_its_idle_sleep(real_q: Quick) -> None:
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=0.1))
    consumer.start()
    began = time.monotonic()
    try:
        time.sleep(0.5)
    finally:
        consumer.stop(5)
    elapsed = time.monotonic() - began
    assert consumer.stats["scan"] <= elapsed / 0.1 + 2


def test_enqueue_in_a_transaction_wakes_after_the_commit(real_q: Quick) -> None:
    ran = threading.Event()
    real_q.job("j")(lambda payload, ctx: ran.set())
    consumer = real_q.consumer(ConsumerConfig(idle_sleep_s=60))
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        real_q.transact(lambda tr: real_q.enqueue("j", b"", app="a", tenant="t", tr=tr))
        assert ran.wait(20)
    finally:
        consumer.stop(5)


# --- other processes' commits (stores that can tell cheaply: SQLite, PostgreSQL) ----------

SHARED_STORES = ["sqlite", *(["postgres"] if HAVE_POSTGRES else [])]


def _hears_another_process(
    tmp_path: Path, config: ConsumerConfig, wait_s: float, backend: str = "sqlite"
) -> bool:
    """Whether an idle consumer runs an item another process enqueued within ``wait_s``."""
    url = store_url(backend, tmp_path)
    q = Quick.open(url)
    ran = threading.Event()
    q.job("j")(lambda payload, ctx: ran.set())
    consumer = q.consumer(config)
    consumer.start()
    try:
        assert wait_for(lambda: consumer.stats["scan"] >= 1)
        time.sleep(0.3)  # idle: the first scans found nothing and it sleeps
        enqueue_from_another_process(url, "t", "j")
        return ran.wait(wait_s)
    finally:
        consumer.stop(5)
        q.close()


@pytest.mark.parametrize("backend", SHARED_STORES)
def test_an_enqueue_by_another_process_wakes_an_idle_consumer(tmp_path: Path, backend: str) -> None:
    """The web app enqueues in its own process, the worker runs in another: the idle
    consumer hears of the commit (SQLite's PRAGMA data_version, PostgreSQL's commit
    version) and does not wait for its next poll (an hour away here)."""
    config = ConsumerConfig(idle_sleep_s=3600)
    assert _hears_another_process(tmp_path, config, 30, backend), (
        "the consumer slept through another process's enqueue"
    )


def test_the_commit_wake_up_can_be_turned_off(tmp_path: Path) -> None:
    config = ConsumerConfig(idle_sleep_s=3600, commit_poll_s=None)
    assert not _hears_another_process(tmp_path, config, 1.5)  # polled hourly, as configured


def test_consumers_refusing_an_item_do_not_wake_each_other_with_their_visits(
    tmp_path: Path,
) -> None:
    """Two consumer processes' worth of stores on one file, each routed to a job type the
    queued item is not: every visit commits (the pointer's lease), which the other hears
    of. Neither may rescan on each such commit: they poll at their idle sleep, as before."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    stores = [Quick.open(url), Quick.open(url)]
    for s, name in zip(stores, ("x", "y"), strict=True):
        s.job(name)(lambda payload, ctx: None)
    consumers = [
        s.consumer(ConsumerConfig(idle_sleep_s=0.1, job_types=(name,), in_order=False))
        for s, name in zip(stores, ("x", "y"), strict=True)
    ]
    stores[0].enqueue("z", b"", app="a", tenant="t")
    for c in consumers:
        c.start()
    began = time.monotonic()
    try:
        time.sleep(1.5)
    finally:
        for c in consumers:
            c.stop(5)
        for s in stores:
            s.close()
    elapsed = time.monotonic() - began
    for c in consumers:
        # One scan per idle sleep, and a visit's follow-up scan; rescanning per commit
        # would be hundreds.
        assert c.stats["scan"] <= 2 * (elapsed / 0.1) + 4, c.stats["scan"]


def test_an_idle_consumer_is_not_woken_by_its_own_processes_commits(tmp_path: Path) -> None:
    """The application writes its own data through the worker's Quick (and the consumer
    completes items): commits this store made itself wake nobody, as their enqueues wake
    local consumers directly. Only other stores' commits do (the test above)."""
    url = f"sqlite:///{tmp_path / 'own.db'}"
    q = Quick.open(url)
    done = threading.Event()
    q.job("j")(lambda payload, ctx: done.set())
    consumer = q.consumer(ConsumerConfig(idle_sleep_s=3600, commit_poll_s=0.001))
    consumer.start()
    try:
        q.enqueue("j", b"", app="a", tenant="t")
        assert done.wait(20)
        assert wait_for(lambda: consumer.stats["completed"] == 1)
        time.sleep(0.2)  # the scans that follow a visit are over
        scans = consumer.stats["scan"]
        for n in range(100):
            q.transact(lambda tr, n=n: tr.set(b"users/%d" % n, b"alice"))
            time.sleep(0.003)  # a few ticks apart: each would be seen on its own
        time.sleep(0.1)
        assert consumer.stats["scan"] - scans <= 2, consumer.stats["scan"] - scans
    finally:
        consumer.stop(5)
        q.close()


def test_a_nacked_item_runs_again_at_its_delay_not_at_the_next_idle_poll(
    tmp_path: Path,
) -> None:
    """A handler gives its item back for 50 ms (a retry's backoff works the same way): the
    consumer's own requeue tells its scanner of the new vesting time, so the item runs
    again on its timer, not at the next idle poll (an hour away here)."""
    q = Quick.open(f"sqlite:///{tmp_path / 'nack.db'}")
    runs: list[float] = []
    again = threading.Event()

    def handler(payload: Any, ctx: JobContext) -> None:
        if not runs:
            time.sleep(0.3)  # the scanner has gone idle meanwhile (next pointer: 30 s)
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise Nack(delay_s=0.05)
        again.set()

    q.job("j")(handler)
    consumer = q.consumer(ConsumerConfig(idle_sleep_s=3600))
    consumer.start()
    try:
        q.enqueue("j", b"", app="a", tenant="t")
        assert again.wait(20), "the nacked item waited for the next idle poll"
        assert runs[1] - runs[0] >= 0.05, runs
    finally:
        consumer.stop(5)
        q.close()


def test_a_dead_letter_requeued_through_the_workers_quick_runs_at_once(tmp_path: Path) -> None:
    """An operator requeues a dead letter (CLI, dashboard, admin API) through the Quick a
    consumer of the same process runs on: the consumer runs it now, not at its next idle
    poll (an hour away here)."""
    q = Quick.open(f"sqlite:///{tmp_path / 'dead.db'}")
    runs: list[str] = []
    again = threading.Event()

    def handler(payload: Any, ctx: JobContext) -> None:
        runs.append(ctx.item_id)
        if len(runs) == 1:
            raise PermanentError("bad input")
        again.set()

    q.job("j")(handler)
    consumer = q.consumer(ConsumerConfig(idle_sleep_s=3600))
    consumer.start()
    try:
        item_id = q.enqueue("j", b"", app="a", tenant="t")
        assert wait_for(lambda: consumer.stats["dead_lettered"] == 1)
        time.sleep(0.3)  # the scanner has gone idle
        q.requeue_dead_letter("a", "t", item_id)
        assert again.wait(20), "the requeued item waited for the next idle poll"
        assert runs == [item_id, item_id]
    finally:
        consumer.stop(5)
        q.close()


def test_quick_worker_picks_up_another_processes_enqueue_without_waiting_for_its_poll(
    tmp_path: Path,
) -> None:
    """``quick worker`` in one process, the enqueue in another: the worker's commit poll
    (SQLite) starts the item long before its idle sleep would."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    marker = tmp_path / "ran"
    (tmp_path / "poll_handlers.py").write_text(
        "from pathlib import Path\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open({url!r})\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        f"    Path({str(marker)!r}).write_text('ran')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "quickzones", "worker", "--app-module", "poll_handlers"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "commit poll 0.005s, completion flush 0.01s" in banner, banner
        time.sleep(0.5)  # idle, between polls
        enqueue_from_another_process(url, "t", "j")
        assert wait_for(marker.exists, timeout=30)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_commit_poll_that_is_not_positive_is_refused(bad: float) -> None:
    # None turns the commit poll off; 0 or a negative pace is a mistake, said by name.
    with pytest.raises(ConfigurationError, match="commit_poll_s must be positive"):
        ConsumerConfig(commit_poll_s=bad).validate()

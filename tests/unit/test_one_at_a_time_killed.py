"""An at-most-once holder of a one-at-a-time key whose process dies mid-run (issue 45
point 1, review edge 2): its key passes to the next item once the run's hold lapses, and
the killed item never runs again; a run that outlasts its lease, alive, keeps the key.
Real consumers on one SQLite file, a real process killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for

WORKER = textwrap.dedent(
    """
    import sys, time, pathlib
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    q = Quick.open(sys.argv[1])
    marker = pathlib.Path(sys.argv[2])

    @q.job("once", delivery="at_most_once")
    def once(payload, ctx):
        # One temporary file per item: several workers renaming one shared name could
        # move another's file in just after its open truncated it (an empty marker).
        tmp = marker.with_name(f"{marker.name}.{ctx.item_id}.tmp")
        tmp.write_text(ctx.item_id)
        tmp.rename(marker)  # atomic: the test never reads a half-written marker
        time.sleep(3600)

    q.consumer(ConsumerConfig(item_lease_s=1.0, idle_sleep_s=0.01)).run_forever()
    """
)


def test_a_killed_at_most_once_holder_lets_the_next_item_of_its_key_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    marker = tmp_path / "started"
    q = Quick.open(url)
    done: list[str] = []
    lock = threading.Lock()

    def record(payload: Any, ctx: JobContext) -> None:
        with lock:
            done.append(ctx.item_id)

    q.job("once", delivery="at_most_once")(record)
    q.job("after")(record)
    killed = q.enqueue("once", b"", app="a", tenant="t", one_at_a_time="k")
    nxt = q.enqueue("after", b"", app="a", tenant="t", one_at_a_time="k")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url, str(marker)], env=env)
    try:
        assert wait_for(marker.exists), "the worker never started the at-most-once item"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == killed

    consumer = q.consumer(ConsumerConfig(idle_sleep_s=0.01, outcome_gc_interval_s=0.1))
    consumer.start()
    try:
        assert wait_for(lambda: nxt in done), "the key's next item never ran"
    finally:
        consumer.stop()
    assert done == [nxt]  # the killed one never runs again: at most once
    assert q.get("a", "t", killed) is None
    assert q.zones.count(q.zone("a", "t")) == 0
    q.close()


def test_an_at_most_once_run_longer_than_its_lease_keeps_its_key(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def run(seconds: float) -> Any:
        def handler(payload: Any, ctx: JobContext) -> None:
            start = time.time()
            time.sleep(seconds)
            with lock:
                spans.append((ctx.item.job_type, start, time.time()))

        return handler

    q.job("once", delivery="at_most_once")(run(3.0))  # ten of its leases long
    q.job("after")(run(0.0))
    q.enqueue("once", b"", app="a", tenant="t", one_at_a_time="k")
    q.enqueue("after", b"", app="a", tenant="t", one_at_a_time="k")
    config = ConsumerConfig(
        item_lease_s=0.3, idle_sleep_s=0.01, outcome_gc_interval_s=0.05, workers=2
    )
    consumer = q.consumer(config)
    consumer.start()
    try:
        assert wait_for(lambda: len(spans) == 2)
    finally:
        consumer.stop()
    assert [job for job, _, _ in sorted(spans, key=lambda s: s[1])] == ["once", "after"]
    assert most_at_once([(s, e) for _, s, e in spans]) == 1
    q.close()


def test_a_run_whose_hold_was_lost_is_interrupted(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    started = threading.Event()
    saw: list[bool] = []

    @q.job("once", delivery="at_most_once")
    def once(payload: Any, ctx: JobContext) -> None:
        started.set()
        try:
            end = time.monotonic() + 30
            while time.monotonic() < end and not ctx.lease_lost.is_set():
                time.sleep(0.01)
        finally:  # the interrupt is raised in here
            saw.append(ctx.lease_lost.is_set())

    q.enqueue("once", b"", app="a", tenant="t", one_at_a_time="k")
    consumer = q.consumer(ConsumerConfig(item_lease_s=0.3, idle_sleep_s=0.01))
    consumer.start()
    try:
        assert started.wait(60)
        # What another consumer's maintenance does to a hold it saw lapse: the key is
        # passed on (here: no one waits, so it is freed).
        key = q.keys.flow_key(q.zone("a", "t"), "s", "k")
        q.transact(lambda tr: tr.clear(key))
        assert wait_for(lambda: bool(saw))
    finally:
        consumer.stop()
    assert saw == [True]  # the renewal found the key gone: the handler heard it lost
    q.close()

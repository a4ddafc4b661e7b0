"""FDBStore and QuiCK against a real FoundationDB cluster (see cluster.py for where it comes
from). Without one the whole module skips with one line.

* the KV conformance suite, imported from tests/contract and run here unchanged;
* a QuiCK smoke test over ``fdb://``;
* two consumer processes and concurrent producers: every item runs, none is lost.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from integration.fdb.cluster import session_cluster_file
from quickzones.backends.fdb import FDBOptions, FDBStore
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.store.kv import KVTransaction, run
from tests.contract import test_kv_conformance as conformance

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.fdb


@pytest.fixture(scope="session")
def fdb_cluster() -> str:
    return session_cluster_file()


def _clear_everything(store: FDBStore) -> None:
    # Under a root prefix this is the prefix's range; without one the tests use only conf/.
    begin, end = (b"", b"\xff") if store.prefix else (conformance.P, conformance.P + b"\xff")

    def clear(tr: KVTransaction) -> None:
        tr.clear_range(begin, end)

    run(store, clear)


def fdb_url(cluster: str, root: str) -> str:
    return f"fdb://{quote(cluster)}?root={quote(root)}"


# --- the KV conformance suite, reused --------------------------------------------------------

CONFORMANCE = sorted(
    name for name, fn in vars(conformance).items() if name.startswith("test_") and callable(fn)
)


@pytest.mark.parametrize("name", CONFORMANCE)
def test_kv_conformance(name: str, fdb_cluster: str) -> None:
    fn = getattr(conformance, name)
    params = inspect.signature(fn).parameters
    if "manual_clock" in params:
        pytest.skip("steps a manual clock; a real cluster keeps real time")
    # No key prefix: the suite's exact key-size test needs the whole 10,000 bytes. It keeps
    # every key under conf/, which is cleared before and after.
    store = FDBStore(FDBOptions(cluster_file=fdb_cluster), url=f"fdb://{fdb_cluster}")
    _clear_everything(store)
    try:
        fn(**{p: {"kv_store": store, "clock": ManualClock()}[p] for p in params})
    finally:
        _clear_everything(store)
        store.close()


# --- QuiCK over fdb:// ---------------------------------------------------------------------


@pytest.fixture
def quick_url(fdb_cluster: str) -> Iterator[str]:
    url = fdb_url(fdb_cluster, f"quick-it-{uuid.uuid4().hex}/")
    yield url
    store = FDBStore.from_url(url)
    _clear_everything(store)
    store.close()


def test_quick_smoke(quick_url: str) -> None:
    q = Quick.open(quick_url)
    seen: list[tuple[str, int]] = []
    q.job("job")(lambda payload, ctx: seen.append((ctx.tenant, payload["i"])))
    for i in range(20):
        q.enqueue("job", {"i": i}, app="app", tenant=f"t{i % 4}")

    def in_users_txn(tr: KVTransaction) -> None:
        tr.set(b"user/data", b"x")
        q.enqueue("job", {"i": 99}, app="app", tenant="t0", tr=tr)

    q.transact(in_users_txn)
    assert q.run_until_idle() == 21
    assert sorted(i for _, i in seen) == [*range(20), 99]
    assert all(q.zones.count(q.zone("app", f"t{t}")) == 0 for t in range(4))
    q.close()


def test_fifo_follows_commit_order_on_a_real_cluster(quick_url: str) -> None:
    """Two producers, one with a clock 10 s behind: FIFO items come out in commit order."""
    ahead = Quick.open(quick_url, fifo=True)
    behind = Quick(ahead.kv, clock=ManualClock(ahead.clock.now() - 10), fifo=True)
    ids = []
    for i in range(10):
        ids.append((ahead if i % 2 == 0 else behind).enqueue("job", i, app="a", tenant="t"))
    ids += ahead.enqueue_many("job", range(5), app="a", tenant="t")
    zone = ahead.zone("a", "t")
    assert [i.item_id for i in ahead.zones.peek(zone, 100)] == ids
    items, _ = ahead.zones.dequeue(zone, 100, 30_000)
    assert [i.item_id for i in items] == ids
    ahead.zones.complete_many(zone, [(i.item_id, str(i.lease_id)) for i in items])
    assert ahead.zones.count(zone) == 0
    ahead.close()


CONSUMER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    q = Quick.open(sys.argv[1])
    log = sys.argv[2]

    @q.job("job")
    def job(payload, ctx):
        # One O_APPEND write per line: lines from both processes never interleave.
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, (ctx.item_id + "\\n").encode())
        finally:
            os.close(fd)

    q.consumer(ConsumerConfig(idle_sleep_s=0.01, item_lease_s=10.0)).run_forever()
    """
)


def test_two_consumer_processes_and_concurrent_producers_lose_nothing(
    quick_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "done.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    consumers = [
        subprocess.Popen([sys.executable, "-c", CONSUMER, quick_url, str(log)], env=env)
        for _ in range(2)
    ]
    producer = Quick.open(quick_url)
    enqueued: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            for i in range(60):
                item_id = producer.enqueue("job", {"p": n, "i": i}, app="app", tenant=f"t{i % 7}")
                with lock:
                    enqueued.append(item_id)
        except BaseException as err:  # reported below; a thread cannot fail the test itself
            errors.append(err)

    try:
        producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        for t in producers:
            t.start()
        for t in producers:
            t.join(120)
        assert not errors, errors
        assert len(enqueued) == 240
        done: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = set(log.read_text().split()) if log.exists() else set()
            if done >= set(enqueued):
                break
            time.sleep(0.2)
        missing = set(enqueued) - done
        assert not missing, f"{len(missing)} of {len(enqueued)} items never ran"
        zones = [producer.zone("app", f"t{t}") for t in range(7)]
        # A handler logs before its completion commits: give the last completions a moment.
        while time.monotonic() < deadline and any(producer.zones.count(z) for z in zones):
            time.sleep(0.2)
        assert [producer.zones.count(z) for z in zones] == [0] * 7
    finally:
        for proc in consumers:
            proc.terminate()
        for proc in consumers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        producer.close()

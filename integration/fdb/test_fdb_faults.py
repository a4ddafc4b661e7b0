"""Faults on a real FoundationDB (issue 14, point 4): producers and consumer processes keep
going while ``fdbserver`` is SIGKILLed and restarted (``ssd`` engine, so data survives) and
while it is SIGSTOPped for longer than a transaction's 5 s lifetime; a consumer process is
SIGKILLed and restarted under load.

Checked: every item whose enqueue returned runs (nothing committed is lost); each item's
transactional effect (an ``add`` in the handler's transaction, committed with the item's
completion) is applied exactly once; no call hangs past its timeout (``timeout_ms`` in the
URL); the consumers that were not killed run items again after each fault, without a
restart. The server here is its own, not the session's: the test kills it.
"""

from __future__ import annotations

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

from quickzones.client import Quick
from quickzones.errors import QuickError
from quickzones.store.kv import KVError, KVTransaction, run, unpack_i64
from quickzones.testing.provision import LocalFDB, find_fdb_dist, use_fdb_library

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.fdb

CONSUMER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    from quickzones.store.kv import pack_i64
    q = Quick.open(sys.argv[1])
    log = sys.argv[2]

    @q.job("job", transactional=True)
    def job(payload, ctx):
        # The effect commits with the item's completion: exactly once, or not at all.
        ctx.tr.add(b"effect/" + ctx.item_id.encode(), pack_i64(1))
        # The log is outside the transaction: at least once. One O_APPEND write per line.
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{os.getpid()} {ctx.item_id}\\n".encode())
        finally:
            os.close(fd)

    q.consumer(ConsumerConfig(idle_sleep_s=0.01, item_lease_s=10.0, workers=4,
                              managers=2)).run_forever()
    """
)


@pytest.fixture
def server() -> Iterator[LocalFDB]:
    dist = find_fdb_dist()
    if dist is None:
        pytest.skip("the fault tests start their own fdbserver; only a cluster file is given")
    if dist.libfdb_c is not None and "FDB_LIBRARY_PATH" not in os.environ:
        use_fdb_library(dist.libfdb_c)
    with LocalFDB(dist, storage_engine="ssd") as fdb:
        fdb.start(120)
        yield fdb


class Load:
    """Producers in threads: each item id is recorded once its enqueue returned."""

    def __init__(self, quick: Quick, threads: int = 2) -> None:
        self.quick = quick
        self.acked: list[str] = []
        self.failures = 0  # enqueues that raised (timeouts while the server is away)
        self.longest_call_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, args=(n,)) for n in range(threads)]

    def _produce(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            item_id = f"p{n}-{i}"
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    # A caller-chosen id makes the retry after a timeout idempotent.
                    self.quick.enqueue("job", {"i": i}, app="app", tenant=f"t{i % 5}",
                                       item_id=item_id)  # fmt: skip
                except (KVError, QuickError):
                    with self._lock:
                        self.failures += 1
                    time.sleep(0.1)
                    continue
                finally:
                    with self._lock:
                        self.longest_call_s = max(self.longest_call_s, time.monotonic() - started)
                with self._lock:
                    self.acked.append(item_id)
                break
            i += 1
            time.sleep(0.01)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def _log(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, _, item_id = line.partition(" ")
        out.append((int(pid), item_id))
    return out


def _ran_since(path: Path, mark: int, pid: int) -> bool:
    return any(p == pid for p, _ in _log(path)[mark:])


def _wait(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_server_killed_paused_and_consumer_killed_lose_nothing_and_apply_once(
    server: LocalFDB, tmp_path: Path
) -> None:
    root = f"quick-faults-{uuid.uuid4().hex[:8]}/"
    # 5 s per transaction: a call fails with 1031 (transaction_timed_out) rather than
    # waiting for the server; the producer retries with the same item id.
    url = f"fdb://{quote(str(server.cluster_file))}?root={quote(root)}&timeout_ms=5000"
    log = tmp_path / "done.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def consumer() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", CONSUMER, url, str(log)], env=env,
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "consumers.err", "ab"),
        )  # fmt: skip

    consumers = [consumer(), consumer()]
    producer = Quick.open(url)
    figures: dict[str, float] = {}
    try:
        with Load(producer) as load:
            _wait(lambda: len(_log(log)) >= 50, 120, "the consumers to run 50 items")

            # 1. SIGKILL the server, restart it on the same data (ssd).
            server.kill()
            time.sleep(2)
            server.start(120)
            mark = len(_log(log))
            for c in consumers:
                _wait(lambda c=c: _ran_since(log, mark, c.pid), 120,
                      f"consumer {c.pid} to run items after the server restart")  # fmt: skip

            # 2. SIGSTOP the server for longer than a transaction's lifetime.
            server.pause()
            time.sleep(7)
            server.resume()
            mark = len(_log(log))
            for c in consumers:
                _wait(lambda c=c: _ran_since(log, mark, c.pid), 120,
                      f"consumer {c.pid} to run items after the pause")  # fmt: skip

            # 3. SIGKILL a consumer under load; start a new one.
            consumers[0].kill()
            consumers[0].wait(30)
            consumers[0] = consumer()
            mark = len(_log(log))
            for c in consumers:
                _wait(lambda c=c: _ran_since(log, mark, c.pid), 120,
                      f"consumer {c.pid} to run items after the consumer kill")  # fmt: skip
            time.sleep(1)
        acked = set(load.acked)
        figures["acked"] = len(acked)
        figures["enqueue_failures"] = load.failures
        figures["longest_enqueue_call_s"] = round(load.longest_call_s, 2)

        # Everything acknowledged runs; item leases (10 s) of the killed consumer expire.
        _wait(lambda: acked <= {i for _, i in _log(log)}, 180, "every acknowledged item to run")
        zones = [producer.zone("app", f"t{t}") for t in range(5)]
        _wait(lambda: all(producer.zones.count(z) == 0 for z in zones), 120, "zones to empty")

        def effects(tr: KVTransaction) -> dict[str, int]:
            rows = tr.get_range(b"effect/", b"effect0")
            return {k[len(b"effect/") :].decode(): unpack_i64(v) for k, v in rows}

        applied = run(producer.kv, effects)
        twice = {i: n for i, n in applied.items() if n != 1}
        assert not twice, f"effects applied more than once: {list(twice.items())[:10]}"
        missing = acked - set(applied)
        assert not missing, f"{len(missing)} acknowledged items have no effect"
        ran = [i for _, i in _log(log)]
        figures["runs"] = len(ran)
        figures["reruns"] = len(ran) - len(set(ran))  # at-least-once log; effects were once
        # A call may wait out one timeout per attempt; bound it generously (no hang).
        assert load.longest_call_s < 120
        print(f"\nfaults: {figures}")
    finally:
        for c in consumers:
            c.terminate()
        for c in consumers:
            try:
                c.wait(30)
            except subprocess.TimeoutExpired:
                c.kill()
        producer.close()


STARTS_A_SERVER = """
import sys, time
from quickzones.testing.provision import LocalFDB, find_fdb_dist
server = LocalFDB(find_fdb_dist())
server.start(120)
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_test_process_leaves_no_fdbserver_behind() -> None:
    if find_fdb_dist() is None:
        pytest.skip("needs an fdbserver binary")
    parent = subprocess.Popen([sys.executable, "-c", STARTS_A_SERVER], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        os.kill(server_pid, 0)  # running
        parent.kill()  # SIGKILL: no atexit, no finally; only PR_SET_PDEATHSIG is left
        parent.wait(30)

        def gone() -> bool:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                return True
            # A zombie until its parent (now init) reaps it: count that as gone.
            state = Path(f"/proc/{server_pid}/stat").read_text().split()[2]
            return state == "Z"

        _wait(gone, 30, f"fdbserver {server_pid} to die with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()

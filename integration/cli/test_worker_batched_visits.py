"""Batched visits in a real ``quick worker`` process: ``--one-transaction-visits
--visits-per-transaction 8`` over many small tenants runs every item exactly once while a
producer in another process keeps enqueueing into the same zones (so some batches
conflict and are tried again or split); without ``--one-transaction-visits`` the option is
refused with its name, nothing started."""

from __future__ import annotations

import textwrap
import time
from collections import Counter
from pathlib import Path

from integration.cli.workers import start_worker, stop_worker
from quickzones.client import Quick

HANDLERS = textwrap.dedent(
    """
    import os
    from quickzones.client import Quick

    quick = Quick.open(os.environ["QUICK_STORE"])
    fd = os.open(os.environ["QUICK_RAN_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    @quick.job("small")
    def small(payload, ctx):
        os.write(fd, f"{ctx.item_id}\\n".encode())
    """
)


def _ran(tmp_path: Path) -> Counter[str]:
    log = tmp_path / "ran.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


def test_a_batching_worker_runs_every_item_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'batched.db'}"
    q = Quick.open(store)
    proc = start_worker(
        tmp_path,
        store,
        "batched_handlers",
        HANDLERS,
        "--one-transaction-visits",
        "--visits-per-transaction",
        "8",
        "--dequeue-max",
        "2",
    )
    try:
        ids = []
        for n in range(300):
            ids.append(q.enqueue("small", n, app="app", tenant=f"t{n % 40}"))
            if n % 10 == 0:
                time.sleep(0.005)  # spread out: the worker visits while more arrive
        deadline = time.monotonic() + 60
        while sum(_ran(tmp_path).values()) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything run twice would show up now
    finally:
        err = stop_worker(proc)
        q.close()
    ran = _ran(tmp_path)
    assert sorted(ran) == sorted(ids), err.decode()[-2000:]
    assert set(ran.values()) == {1}
    assert proc.returncode == 0, err.decode()[-2000:]


def test_a_batch_size_without_one_transaction_visits_is_refused(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'refused.db'}"
    proc = start_worker(
        tmp_path, store, "refused_handlers", HANDLERS, "--visits-per-transaction", "8"
    )
    _, err = proc.communicate(timeout=60)  # exits on its own: the option is refused
    assert proc.returncode == 2
    assert b"needs one_transaction_visits=True" in err and b"Traceback" not in err

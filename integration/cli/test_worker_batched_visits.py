"""Batched visits in a real consumer process, configured from Python
(``ConsumerConfig(one_transaction_visits=True, visits_per_transaction=8)``: no ``quick
worker`` option sets them), over many small tenants: every item runs exactly once while a
producer in another process keeps enqueueing into the same zones (so some batches
conflict and are tried again or split)."""

from __future__ import annotations

import textwrap
import time
from collections import Counter
from pathlib import Path

from integration.cli.workers import start_consumer, stop_worker
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
    proc = start_consumer(
        tmp_path,
        store,
        "batched_handlers",
        HANDLERS,
        one_transaction_visits=True,
        visits_per_transaction=8,
        dequeue_max=2,
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

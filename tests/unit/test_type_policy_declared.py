"""A job type's policy is declared at registration and stored by the process's own writes
(issue 27 point 5, review): ``Quick.job(store_policy=...)`` is gone. A registration writes
nothing; the policy is stored when a consumer starts and with the first enqueue that
commits in quick's own transaction, never inside an application's transaction (its
isolation, its lock and its rollback are the application's: a policy written there would
wait for the application's lock on a shared SQLite file, and vanish with its rollback).

From the user's side, with real processes: a producer that never imports the handler
module gets the policy the ``quick worker`` process registered; a type registered and
then enqueued inside the application's own SQLite transaction (what the Django backend's
producers do) waits for nothing, logs nothing, and its policy reaches other producers
with the process's next enqueue of its own."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.registry import JobContext
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")

HANDLERS = """\
import sys
from quickzones import Quick
quick = Quick.open({url!r})
@quick.job("charge", keep_status_s=3600, keep_result_s=3600, dedupe_s=3600)
def charge(payload, ctx):
    return {{"charged": payload["amount"]}}
"""

PRODUCER = (
    "import sys; from quickzones.client import Quick\n"
    "q = Quick.open(sys.argv[1])\n"
    "print(q.enqueue('charge', {'amount': 5}, app='billing', tenant='t',"
    " item_id='order-42').duplicate)\n"
    "q.close()\n"
)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``quick worker`` over handlers.py; yields once its consumer started."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    (tmp_path / "handlers.py").write_text(HANDLERS.format(url=url))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    proc = subprocess.Popen(
        [str(QUICK), "worker", "--app-module", "handlers", "--shutdown-deadline", "5"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # its banner comes once its consumer is built
        if line.startswith("quick worker "):
            break
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _produce(url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER, url], check=True, timeout=60, capture_output=True,
        text=True, cwd="/",
    )  # fmt: skip
    return done.stdout.strip()


def test_a_producer_process_gets_the_policy_the_worker_process_registered(
    tmp_path: Path, worker: subprocess.Popen[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert _produce(url) == "None"
    reader = Quick.open(url)  # no handler either: reads what the worker kept
    try:
        assert wait_for(lambda: reader.result("billing", "t", "order-42") is not None, 60)
        assert reader.result("billing", "t", "order-42") == {"charged": 5}
        # The type's dedupe window holds for this producer too: the same id is not rerun.
        assert _produce(url) == "completed"
    finally:
        reader.close()


def test_a_type_registered_inside_an_application_transaction_writes_nothing_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "app.db"
    url = f"sqlite:///{db}?busy_timeout_ms=2000"
    web = Quick.open(url)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.commit()
    caplog.set_level(logging.WARNING, logger="quick")
    runs: list[Any] = []
    try:
        conn.execute("INSERT INTO orders (id) VALUES (1)")  # the application's transaction

        # Registered lazily, at the first enqueue, as the Django backend does.
        @web.job("ship", keep_result_s=3600)
        def ship(payload: Any, ctx: JobContext) -> Any:
            runs.append(payload)
            return "shipped"

        item_id = web.enqueue_on(conn, "ship", {"order": 1}, app="shop", tenant="t")
        conn.commit()
        assert [r.getMessage() for r in caplog.records] == []  # nothing waited, nothing failed
        other = Quick.open(url)  # a producer without the handler
        try:
            assert other.type_policies.get("ship") is None  # not stored in the app's commit
            web.enqueue("ship", {"order": 2}, app="shop", tenant="t")  # quick's own commit
            other.type_policies.cache_s = 0
            stored = other.type_policies.get("ship")
            assert stored is not None and stored.outcome.result_ms == 3_600_000
        finally:
            other.close()
        assert web.run_until_idle() == 2
        assert web.result("shop", "t", item_id) == "shipped"
    finally:
        conn.close()
        web.close()


def test_store_policy_is_no_longer_a_parameter(q: Quick) -> None:
    with pytest.raises(TypeError, match="store_policy"):
        q.job("x", store_policy=False)  # type: ignore[call-arg]

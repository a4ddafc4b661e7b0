"""Pause and resume an app, a tenant or a job type (issue 31 point 3), from the user's side:
``Quick.pause``/``resume``/``paused``, ``AsyncQuick``, the ``quick`` CLI and a running
``quick worker`` process. Nothing paused starts, running items finish, enqueues are
accepted, and a held-back item counts no attempt."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.aio import AsyncQuick
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import ConsumerConfig
from quickzones.errors import InvalidArgument
from quickzones.registry import JobContext
from quickzones.store.pauses import REFRESH_S, Pause
from tests.conftest import store_url
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")


def _record(q: Quick, ran: list[tuple[str, str]], *types: str) -> None:
    for job_type in types:

        def handler(payload: object, ctx: JobContext, job_type: str = job_type) -> None:
            ran.append((ctx.zone.tenant, job_type))

        q.job(job_type)(handler)


def test_a_paused_tenant_starts_nothing_others_run_and_resume_runs_it(
    q: Quick, clock: ManualClock
) -> None:
    ran: list[tuple[str, str]] = []
    _record(q, ran, "j")
    q.pause(app="a", tenant="t1")
    held = [q.enqueue("j", b"", app="a", tenant="t1") for _ in range(5)]  # still accepted
    for _ in range(5):
        q.enqueue("j", b"", app="a", tenant="t2")
    q.run_until_idle()
    assert sorted(ran) == [("t2", "j")] * 5
    for item_id in held:
        status = q.status("a", "t1", item_id)
        assert status is not None and status.state == "queued" and status.attempts == 0
    assert q.paused() == [Pause("a", "t1", None, q.paused()[0].since_ms)]
    assert q.resume(app="a", tenant="t1") is True
    assert q.resume(app="a", tenant="t1") is False  # nothing left to lift
    clock.advance(REFRESH_S)  # a held-back zone is looked at again a second later
    q.run_until_idle()
    assert sorted(ran) == [("t1", "j")] * 5 + [("t2", "j")] * 5
    assert q.dead_letters() == []


def test_a_paused_app_holds_every_tenant_and_other_apps_run(q: Quick, clock: ManualClock) -> None:
    ran: list[tuple[str, str]] = []
    _record(q, ran, "j")
    q.pause(app="a")
    q.enqueue("j", b"", app="a", tenant="t1")
    q.enqueue("j", b"", app="a", tenant="t2")
    q.enqueue("j", b"", app="b", tenant="t3")
    q.run_until_idle()
    assert ran == [("t3", "j")]
    q.resume(app="a")
    clock.advance(REFRESH_S)
    q.run_until_idle()
    assert sorted(ran) == [("t1", "j"), ("t2", "j"), ("t3", "j")]


def test_a_paused_job_type_is_left_vested_and_the_zones_other_items_run(
    q: Quick, clock: ManualClock
) -> None:
    ran: list[tuple[str, str]] = []
    _record(q, ran, "report", "email")
    q.pause(job_type="report")  # every app's
    reports = [q.enqueue("report", b"", app="a", tenant="t1") for _ in range(3)]
    for _ in range(3):
        q.enqueue("email", b"", app="a", tenant="t1")
    q.run_until_idle()
    assert ran == [("t1", "email")] * 3
    for item_id in reports:
        status = q.status("a", "t1", item_id)
        assert status is not None and status.state == "queued" and status.attempts == 0
    q.resume(job_type="report")
    clock.advance(REFRESH_S)
    q.run_until_idle()
    assert sorted(ran) == [("t1", "email")] * 3 + [("t1", "report")] * 3


def test_a_job_type_paused_for_one_app_runs_in_another(q: Quick) -> None:
    ran: list[tuple[str, str]] = []
    _record(q, ran, "report")
    q.pause(app="a", job_type="report")
    q.enqueue("report", b"", app="a", tenant="t1")
    q.enqueue("report", b"", app="b", tenant="t1")
    q.run_until_idle()
    assert len(ran) == 1
    assert [p.describe() for p in q.paused()] == ["app=a job_type=report"]


def test_running_items_finish_when_their_tenant_is_paused(q: Quick) -> None:
    started = threading.Event()
    release = threading.Event()
    done: list[str] = []

    @q.job("slow")
    def slow(payload: object, ctx: JobContext) -> None:
        started.set()
        release.wait(30)
        done.append(ctx.item_id)

    first = q.enqueue("slow", b"", app="a", tenant="t1")
    consumer = q.consumer(ConsumerConfig(workers=2, in_order=True))
    consumer.start()
    try:
        assert started.wait(30)
        q.pause(app="a", tenant="t1")
        release.set()
        assert wait_for(lambda: done == [first], 30)
    finally:
        consumer.stop()
    status = q.status("a", "t1", first)
    assert status is None or status.state == "completed"


def test_items_a_consumer_holds_do_not_start_once_their_tenant_is_paused(
    backend: str, tmp_path: Path
) -> None:
    """A consumer leases items ahead of its workers (up to 16 a worker); a pause must hold
    those back too, not only the items still in their zone: only what was running at the
    pause finishes, the held items go back unstarted with no attempt counted, and all run
    after the resume."""
    q = Quick.open(store_url(backend, tmp_path))  # the system clock: handlers sleep for real
    lock = threading.Lock()
    starts: list[str] = []
    after_pause: list[str] = []
    paused = threading.Event()

    @q.job("slow")
    def slow(payload: object, ctx: JobContext) -> None:
        with lock:
            starts.append(ctx.item_id)
            if paused.is_set():
                after_pause.append(ctx.item_id)
        time.sleep(0.2)

    ids = [q.enqueue("slow", b"", app="a", tenant="t1") for _ in range(100)]
    consumer = q.consumer(ConsumerConfig(workers=2))
    consumer.start()
    try:
        assert wait_for(lambda: len(starts) >= 2, 60)
        q.pause(app="a", tenant="t1")
        paused.set()
        # Another process's pause is read within REFRESH_S; this one's at once. Either
        # way, wait past it and past the 0.2 s runs of what was running.
        time.sleep(REFRESH_S * 2)
        with lock:
            started = set(starts)
        # At most the two workers' items that had passed their start check as it paused.
        assert len(after_pause) <= 2, f"{len(after_pause)} started after the pause"
        held = [i for i in ids if i not in started]

        def given_back() -> bool:
            statuses = [q.status("a", "t1", i) for i in held]
            return all(s is not None and s.state == "queued" for s in statuses)

        assert wait_for(given_back, 60)
        assert all(q.status("a", "t1", i).attempts == 0 for i in held)  # type: ignore[union-attr]
        with lock:
            assert set(starts) == started  # nothing more started while paused
        q.resume(app="a", tenant="t1")
        assert wait_for(lambda: len(set(starts)) == 100, 120)
    finally:
        consumer.stop()
    assert sorted(starts) == sorted(ids)  # each ran once
    assert q.dead_letters() == []
    q.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "name an app"),
        ({"tenant": "t1"}, "with its app"),
        ({"app": ""}, "must not be empty"),
        ({"app": "a", "job_type": 3}, "must be an identifier"),
    ],
)
def test_a_bad_pause_is_refused_and_stores_nothing(
    q: Quick, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        q.pause(**kwargs)  # type: ignore[arg-type]
    assert q.paused() == []


def test_async_quick_pauses_and_resumes(q: Quick) -> None:
    aq = AsyncQuick(q)

    async def go() -> tuple[list[Pause], bool, list[Pause]]:
        await aq.pause(app="a", tenant="t1")
        listed = await aq.paused()
        lifted = await aq.resume(app="a", tenant="t1")
        return listed, lifted, await aq.paused()

    listed, lifted, after = asyncio.run(go())
    assert [(p.app, p.tenant) for p in listed] == [("a", "t1")] and lifted and after == []


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_the_cli_pauses_lists_resumes_and_stats_shows_it(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'p.db'}"
    Quick.open(store).close()
    code, out = _invoke("--store", store, "pause", "--app", "a", "--tenant", "t1")
    assert code == 0, out
    assert "paused app=a tenant=t1" in out
    code, out = _invoke("--store", store, "paused", "--json")
    assert code == 0, out
    assert [{k: p[k] for k in ("app", "tenant", "job_type")} for p in json.loads(out)] == [
        {"app": "a", "tenant": "t1", "job_type": None}
    ]
    code, out = _invoke("--store", store, "stats", "--json")
    assert json.loads(out)["paused"] == [{"app": "a", "tenant": "t1", "job_type": None}]
    code, out = _invoke("--store", store, "stats")
    assert "paused: app=a tenant=t1" in out
    code, out = _invoke("--store", store, "resume", "--app", "a", "--tenant", "t1")
    assert code == 0 and "resumed app=a tenant=t1" in out
    code, out = _invoke("--store", store, "resume", "--app", "a", "--tenant", "t1")
    assert code == 1 and "was not paused" in out
    code, out = _invoke("--store", store, "pause", "--tenant", "t1")
    assert code != 0 and "with its app" in out


# --- a running quick worker process -----------------------------------------------------


class _Worker:
    """``quick worker`` over a handler module that appends 'tenant item_id' to done.txt."""

    def __init__(self, tmp_path: Path, db: Path) -> None:
        (tmp_path / "handlers.py").write_text(
            "from quickzones import Quick\n"
            f"quick = Quick.open('sqlite:///{db}')\n"
            "@quick.job('j')\n"
            "def j(payload, ctx):\n"
            f"    with open({str(tmp_path / 'done.txt')!r}, 'a') as f:\n"
            "        f.write(f'{ctx.zone.tenant} {ctx.item_id}\\n')\n"
        )
        self.done_file = tmp_path / "done.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("QUICK_STORE", None)
        self.proc = subprocess.Popen(
            [str(QUICK), "worker", "--app-module", "handlers", "--shutdown-deadline", "5"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def done(self) -> list[tuple[str, str]]:
        if not self.done_file.exists():
            return []
        rows = self.done_file.read_text().splitlines()
        return [(t, i) for t, i in (row.split() for row in rows if row.strip())]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Quick]:
    q = Quick.open(f"sqlite:///{tmp_path / 'w.db'}")
    yield q
    q.close()


def test_a_running_worker_process_holds_a_paused_tenant_and_runs_it_on_resume(
    tmp_path: Path, producer: Quick
) -> None:
    worker = _Worker(tmp_path, tmp_path / "w.db")
    try:
        first = producer.enqueue("j", b"", app="a", tenant="t1")
        assert wait_for(lambda: ("t1", first) in worker.done(), 60)  # it is running
        producer.pause(app="a", tenant="t1")
        # A running consumer reads the pauses again at most REFRESH_S later.
        time.sleep(REFRESH_S * 1.5)
        held = {producer.enqueue("j", b"", app="a", tenant="t1") for _ in range(5)}
        others = {producer.enqueue("j", b"", app="a", tenant="t2") for _ in range(5)}
        assert wait_for(lambda: others <= {i for _, i in worker.done()}, 60)
        # Its pointer was looked at (the zone is visited once a second while paused).
        time.sleep(REFRESH_S * 1.5)
        assert not held & {i for _, i in worker.done()}
        assert all(producer.status("a", "t1", i).attempts == 0 for i in held)  # type: ignore[union-attr]
        producer.resume(app="a", tenant="t1")
        assert wait_for(lambda: held <= {i for _, i in worker.done()}, 60)
    finally:
        assert worker.stop() == 0

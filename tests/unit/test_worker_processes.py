"""``quick worker --processes N`` (issue 29 point 1), from the user's side with real
processes: N consumer processes under one supervisor, a child killed with SIGKILL is
restarted (logged), SIGTERM to the supervisor stops every child with no item lost, and one
``/metrics`` scrape counts every child's completions."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.supervisor import Backoff, Supervisor
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")
STARTED = re.compile(r"process (\d+) started \(pid (\d+)\)")


def _handlers(tmp_path: Path, db: Path, sleep_s: float) -> None:
    """An app module whose handler appends 'pid item_id' to done.txt once it ran."""
    (tmp_path / "handlers.py").write_text(
        "import os, time\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        f"    time.sleep({sleep_s})\n"
        f"    with open({str(tmp_path / 'done.txt')!r}, 'a') as f:\n"
        "        f.write(f'{os.getpid()} {ctx.item_id}\\n')\n"
    )


def _done(tmp_path: Path) -> list[tuple[int, str]]:
    path = tmp_path / "done.txt"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(pid), item) for pid, item in rows]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Supervised:
    """``quick worker --processes N`` in a process of its own; its log lines read on a
    thread."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("QUICK_STORE", None)
        self.proc = subprocess.Popen(
            [str(QUICK), "worker", "--app-module", "handlers", "--shutdown-deadline", "5",
             *extra],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def children(self) -> dict[int, int]:
        """The latest pid of each process number, from the 'started' log lines."""
        return {int(n): int(pid) for n, pid in STARTED.findall(self.text())}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._reader.join(timeout=5)


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Quick]:
    q = Quick.open(f"sqlite:///{tmp_path / 'w.db'}")
    yield q
    q.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_one_metrics_scrape_counts_every_childs_completions(
    tmp_path: Path, producer: Quick
) -> None:
    pytest.importorskip("prometheus_client")
    _handlers(tmp_path, tmp_path / "w.db", 0.01)
    port = _free_port()
    sup = Supervised(tmp_path, "--processes", "2", "--metrics-port", str(port))
    try:
        assert wait_for(lambda: len(sup.children()) == 2, 60), sup.text()
        ids = {producer.enqueue("j", {"n": i}, app="a", tenant=f"t{i}") for i in range(60)}
        assert wait_for(lambda: len(_done(tmp_path)) >= 60, 120), sup.text()
        pids = {pid for pid, _ in _done(tmp_path)}
        assert pids <= set(sup.children().values())

        def completed() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body = r.read().decode()
            return sum(
                float(m.group(1))
                for m in re.finditer(r'^quick_events_total\{[^}]*event="completed"[^}]*\} (\S+)',
                                     body, re.M)
            )  # fmt: skip

        # Completions are counted as each is committed: the scrape catches up at once.
        assert wait_for(lambda: completed() == 60, 30), completed()
        assert {item for _, item in _done(tmp_path)} == ids
    finally:
        assert sup.stop() == 0, sup.text()


def test_a_killed_child_is_restarted_and_logged(tmp_path: Path, producer: Quick) -> None:
    _handlers(tmp_path, tmp_path / "w.db", 0.0)
    sup = Supervised(tmp_path, "--processes", "2")
    try:
        assert wait_for(lambda: len(sup.children()) == 2, 60), sup.text()
        before = sup.children()
        os.kill(before[1], signal.SIGKILL)
        assert wait_for(lambda: sup.children().get(1, before[1]) != before[1], 60), sup.text()
        assert re.search(r"process 1 \(pid \d+\) died .*restarting in", sup.text()), sup.text()
        assert sup.children()[2] == before[2]  # the other child ran on
        ids = {producer.enqueue("j", b"", app="a", tenant=f"t{i}") for i in range(20)}
        assert wait_for(lambda: {i for _, i in _done(tmp_path)} == ids, 120), sup.text()
    finally:
        assert sup.stop() == 0, sup.text()


def test_sigterm_stops_every_child_and_loses_no_item(tmp_path: Path, producer: Quick) -> None:
    _handlers(tmp_path, tmp_path / "w.db", 0.2)
    sup = Supervised(tmp_path, "--processes", "2", "--workers", "2")
    ids = {producer.enqueue("j", b"", app="a", tenant=f"t{i % 8}") for i in range(80)}
    try:
        assert wait_for(lambda: len(sup.children()) == 2, 60), sup.text()
        assert wait_for(lambda: len(_done(tmp_path)) >= 4, 60), sup.text()
        children = sup.children()
    finally:
        code = sup.stop()
    assert code == 0, sup.text()
    assert [pid for pid in children.values() if _alive(pid)] == []
    assert "restarting" not in sup.text()  # a stop is not a death
    ran = [item for _, item in _done(tmp_path)]
    assert len(ran) == len(set(ran)) and len(ran) < len(ids)
    assert producer.dead_letters() == []
    # Every item not run is still queued, vested again: another consumer runs the rest.
    rest: list[str] = []

    @producer.job("j")
    def j(payload: object, ctx: object) -> None:
        rest.append(ctx.item_id)  # type: ignore[attr-defined]

    producer.run_until_idle(ConsumerConfig(item_lease_s=30))
    assert set(ran) | set(rest) == ids and not set(ran) & set(rest)


def test_backoff_doubles_to_its_cap() -> None:
    backoff = Backoff(first_s=1.0, max_s=30.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 5, 6, 20)] == [1, 2, 4, 16, 30, 30]


def test_a_child_that_keeps_dying_waits_longer_each_time() -> None:
    now = [0.0]
    exits: list[int] = []
    said: list[str] = []
    supervisor = Supervisor(
        [sys.executable, "-c", "raise SystemExit(3)"],
        1,
        backoff=Backoff(first_s=0.05, max_s=0.2, stable_s=60),
        on_exit=exits.append,
        say=said.append,
        clock=lambda: now[0],
        poll_s=0.01,
    )
    slot = supervisor.slots[0]

    def tick() -> None:
        now[0] += 0.01
        supervisor._tend(slot)

    supervisor._start(slot)
    delays = []
    while len(delays) < 4:
        assert slot.proc is not None
        slot.proc.wait(30)
        tick()  # reaped: the restart is scheduled
        assert slot.restart_at is not None
        delays.append(round(slot.restart_at - now[0], 2))
        while slot.proc is None:
            tick()
    assert delays == [0.05, 0.1, 0.2, 0.2]
    assert len(exits) == 4 and len(said) == 5  # every start said, every exit reported
    assert slot.proc is not None
    slot.proc.wait(30)
    supervisor.request_stop()
    assert supervisor._stop_all() == 1  # the last child exited 3: not a clean stop

"""Real processes on one SQLite file whose wall clocks are set back an hour: a dead worker's
lease and a queued item's delay still end on time (issue 12 point 10).

The worker processes run an app module whose Quick is opened with a system clock plus an
offset the test writes into a file: a clock passed in through the public ``clock=`` hook,
nothing patched. ``quick worker`` runs that module as a user would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quickzones.client import Quick

HOUR = 3600

APP = textwrap.dedent(
    """
    import os, pathlib, sys, time
    from quickzones.client import Quick
    from quickzones.clock import SystemClock
    from quickzones.consumer import ConsumerConfig

    class FileSteppedClock(SystemClock):
        \"\"\"The system clock plus the seconds written in a file: the test steps it.\"\"\"

        def __init__(self, path):
            self.path = pathlib.Path(path)
            self.offset = 0.0

        def now(self):
            # Read at every call, so whatever the worker does after the test stepped the
            # clock (and then enqueued) sees the step.
            try:
                self.offset = float(self.path.read_text())
            except (OSError, ValueError):
                pass  # keep the last offset
            return time.time() + self.offset

    clock = FileSteppedClock(os.environ["STEP_FILE"])
    q = Quick.open(os.environ["QUICK_STORE"], clock=clock)
    log = pathlib.Path(os.environ["RUN_LOG"])

    @q.job("job")
    def job(payload, ctx):
        with log.open("a") as f:  # one short appended line: never read half-written
            f.write(f"{ctx.item_id} {clock.offset:.0f}\\n")
        if payload == "hang":
            time.sleep(3600)

    if __name__ == "__main__":  # a worker with short leases, to be killed
        q.consumer(ConsumerConfig(item_lease_s=float(sys.argv[1]), idle_sleep_s=0.01)).run_forever()
    """
)


class Cluster:
    """The app module, its store and run log, and the worker processes started on them."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        (tmp_path / "stepapp.py").write_text(APP)
        self.url = f"sqlite:///{tmp_path / 'q.db'}"
        self.log = tmp_path / "runs.log"
        self.log.touch()
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], offset_s: float, name: str) -> subprocess.Popen[bytes]:
        step_file = self.dir / f"step-{name}"
        step_file.write_text(str(offset_s))
        env = {
            **os.environ,
            "QUICK_STORE": self.url,
            "STEP_FILE": str(step_file),
            "RUN_LOG": str(self.log),
        }
        proc = subprocess.Popen([sys.executable, *args], cwd=self.dir, env=env)
        self.procs.append(proc)
        return proc

    def worker(self, offset_s: float, name: str) -> subprocess.Popen[bytes]:
        """``quick worker`` on the app module."""
        cmd = ["-m", "quickzones", "worker", "--app-module", "stepapp:q", "--managers", "1"]
        return self.start([*cmd, "--workers", "2"], offset_s, name)

    def step(self, name: str, offset_s: float) -> None:
        tmp = self.dir / f"step-{name}.tmp"
        tmp.write_text(str(offset_s))
        tmp.rename(self.dir / f"step-{name}")

    def runs_of(self, item_id: str) -> list[int]:
        """The clock offsets of the processes that started ``item_id``, in order."""
        lines = [line.split() for line in self.log.read_text().splitlines()]
        return [int(offset) for iid, offset in lines if iid == item_id]

    def wait_runs(self, item_id: str, count: int, within_s: float) -> list[int]:
        deadline = time.monotonic() + within_s
        while len(self.runs_of(item_id)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.runs_of(item_id)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def test_dead_workers_lease_ends_on_time_for_a_worker_started_after_a_step_back(
    cluster: Cluster,
) -> None:
    producer = Quick.open(cluster.url)
    item_id = producer.enqueue("job", "hang", app="app", tenant="t")
    dying = cluster.start(["stepapp.py", "4"], 0, "dying")  # 4 s leases, renewed while alive
    assert cluster.wait_runs(item_id, 1, 60) == [0], "the first worker never took the item"
    os.kill(dying.pid, signal.SIGKILL)
    dying.wait(10)

    # The clock is set back an hour; a new worker starts. The dead worker's 4 s lease must
    # end about 4 s after it was last renewed, not an hour later.
    cluster.worker(-HOUR, "after-step")
    assert cluster.wait_runs(item_id, 2, 90) == [0, -HOUR]
    producer.close()


def test_running_worker_whose_clock_steps_back_keeps_delays(cluster: Cluster) -> None:
    producer = Quick.open(cluster.url)
    cluster.worker(0, "live")
    warm_up = producer.enqueue("job", "x", app="app", tenant="t")
    assert cluster.wait_runs(warm_up, 1, 60) == [0], "the worker never started"

    cluster.step("live", -HOUR)
    now = producer.enqueue("job", "x", app="app", tenant="t")
    assert cluster.wait_runs(now, 1, 60) == [-HOUR]  # ran after the step, without waiting
    delayed = producer.enqueue("job", "x", app="app", tenant="t", delay=3)
    assert cluster.wait_runs(delayed, 1, 60) == [-HOUR]  # after 3 s, not an hour
    producer.close()

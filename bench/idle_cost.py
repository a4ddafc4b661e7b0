"""What an idle ``quick worker`` costs, and how soon it starts a lone item (issue 44
point 4): a real ``quick worker --workers 4`` process with its defaults, its CPU seconds
(user + system, children included) over an idle span, then lone items enqueued from this
process one at a time, spaced out so the worker is idle before each, and the time from
each enqueue's return to its handler's start.

    python -m bench.idle_cost --store sqlite --idle-s 30 --items 50
    python -m bench.idle_cost --store postgres --idle-s 30 --items 50
    python -m bench.idle_cost --store fdb --idle-s 30 --items 50   # FDB_BIN_DIR or a cluster file

The CPU is the worker process's own (psutil ``cpu_times``), not wall time, so other
load on the machine changes it little; the pickup times are wall times and noisy on a
shared machine. Used by tests/unit/test_idle_cost.py with a short span.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from bench.common import cpu_seconds

HANDLERS = """\
import os, time
from quickzones import Quick
quick = Quick.open(os.environ["QUICK_IDLE_STORE"])
@quick.job("lone")
def lone(payload, ctx):
    with open(os.environ["QUICK_IDLE_STARTS"], "a") as f:
        f.write(f"{payload} {time.time()!r}\\n")
"""


class IdleWorker:
    """A ``quick worker`` process on ``url`` whose handler notes each item's start."""

    def __init__(self, directory: Path, url: str, workers: int = 4) -> None:
        self.directory = directory
        self.url = url
        self.starts = directory / "starts.txt"
        self.log = directory / "worker.log"
        (directory / "idle_handlers.py").write_text(HANDLERS)
        env = {
            **os.environ,
            "QUICK_IDLE_STORE": url,
            "QUICK_IDLE_STARTS": str(self.starts),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "quickzones", "worker", "--app-module", "idle_handlers",
                 "--workers", str(workers)],
                cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.ps = psutil.Process(self.proc.pid)

    def started(self) -> bool:
        """The worker printed its banner (it is about to run)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"quick worker exited: {self.log.read_text()}")
        return "quick worker" in self.log.read_text()

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the worker and its children so far."""
        return cpu_seconds([self.ps, *self.ps.children(recursive=True)])

    def idle_cpu_s(self, span_s: float) -> float:
        """CPU seconds the worker used over ``span_s`` seconds of wall time."""
        before = self.cpu_s()
        time.sleep(span_s)  # the span measured, not a wait for a condition
        return self.cpu_s() - before

    def start_times(self) -> dict[str, float]:
        if not self.starts.exists():
            return {}
        rows = (line.split() for line in self.starts.read_text().splitlines() if line)
        return {name: float(at) for name, at in rows}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def idle_worker(directory: Path, url: str, workers: int = 4) -> Iterator[IdleWorker]:
    worker = IdleWorker(directory, url, workers)
    try:
        deadline = time.monotonic() + 120
        while not worker.started():
            if time.monotonic() > deadline:
                raise RuntimeError(f"quick worker did not start: {worker.log.read_text()}")
            time.sleep(0.05)
        yield worker
    finally:
        worker.stop()


def pickup_s(worker: IdleWorker, quick: object, name: str, timeout_s: float = 60.0) -> float:
    """Enqueue one item named ``name`` and return the seconds from the enqueue's return to
    its handler's start."""
    quick.enqueue("lone", name, app="idle", tenant="t")  # type: ignore[attr-defined]
    enqueued = time.time()
    deadline = time.monotonic() + timeout_s
    while name not in (starts := worker.start_times()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"item {name} not started in {timeout_s} s")
        time.sleep(0.0005)
    return starts[name] - enqueued


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite, postgres (a private server), fdb (a throwaway server), or a store URL",
    )
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--gap-s", type=float, default=0.3, help="idle time before each item")
    args = parser.parse_args()
    from quickzones.client import Quick

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        url = f"sqlite:///{tmp}/quick.db" if args.store == "sqlite" else args.store
        if args.store == "postgres":  # a private server for the run
            from quickzones.testing.provision.postgres import LocalPostgres

            server = servers.enter_context(contextlib.closing(LocalPostgres().start()))
            url = f"{server.url}?schema=idle_cost"
        if args.store == "fdb":  # a throwaway one-process cluster (or QUICK_FDB_CLUSTER_FILE)
            from quickzones.testing.provision.fdb import provide_fdb_cluster_file

            cluster_file = servers.enter_context(provide_fdb_cluster_file())
            url = f"fdb://{cluster_file}?root=idle-cost-{os.getpid()}/"
        quick = Quick.open(url)
        quick.job("lone")(lambda payload, ctx: None)
        quick.store_type_policies()
        with idle_worker(Path(tmp), url) as worker:
            time.sleep(2.0)  # its start-up done
            idle = worker.idle_cpu_s(args.idle_s)
            times = []
            for i in range(args.items):
                time.sleep(args.gap_s)
                times.append(pickup_s(worker, quick, f"item{i}") * 1000)
        quick.close()
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(
        f"idle CPU {idle:.3f} s over {args.idle_s:g} s ({100 * idle / args.idle_s:.2f} % of a "
        f"core); lone-item pickup over {len(times)} items: p50 {statistics.median(times):.1f} "
        f"ms, p99 {p99:.1f} ms, max {times[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()

"""What every system under test offers the peer workloads.

A peer enqueues jobs that call :func:`bench.common.record_start` with (tenant, enqueue
time, due time, work ms), and runs one worker process that executes them. Each peer module
configures its worker the way its documentation recommends for throughput; ``config`` says
how, for the report.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from bench.common import REPO, child_env, log


class Peer(ABC):
    name: str = "peer"
    config: str = ""
    batch_api: str = "none (single enqueues)"
    # Set by workload (i): the peers always run their documented throughput setup; quick
    # switches from its fairness profile to its throughput profile.
    throughput: bool = False

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = workdir / "records.txt"
        # Job ends, where record_ends() asked the worker to write them.
        self.ends = workdir / "ends.txt"
        self.env = child_env(BENCH_OUT=str(self.out))
        os.environ["BENCH_OUT"] = str(self.out)

    def record_ends(self) -> None:
        """Have the worker's jobs append their ends to :attr:`ends` as well as their
        starts (:func:`bench.common.record_start`); one more write per job, for every
        system alike."""
        self.env["BENCH_END_OUT"] = str(self.ends)

    # --- producer side (runs in the bench process) --------------------------------------

    @abstractmethod
    def enqueue(self, tenant: str, work_ms: float = 0.0) -> None: ...

    def enqueue_batch(self, tenant: str, n: int, work_ms: float = 0.0) -> None:
        """The system's bulk enqueue where it has one; single enqueues otherwise."""
        for _ in range(n):
            self.enqueue(tenant, work_ms)

    @abstractmethod
    def enqueue_delayed(self, tenant: str, delay_s: float) -> None: ...

    @abstractmethod
    def reset(self) -> None:
        """Empty the broker between workloads (no worker running)."""

    # --- worker side ---------------------------------------------------------------------

    @abstractmethod
    def worker_cmd(self) -> list[str]: ...

    def start_worker(self) -> None:
        self.out.write_bytes(b"")  # truncate, not unlink: an in-process O_APPEND fd stays valid
        self.ends.write_bytes(b"")
        with open(self.workdir / f"{self.name}-worker.log", "ab") as logf:
            self.proc = subprocess.Popen(
                self.worker_cmd(),
                cwd=REPO,
                env=self.env,
                stdout=logf,
                stderr=logf,
                start_new_session=True,  # its own process group: stop() ends pools and horses
            )

    def stop_worker(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        except ProcessLookupError:
            pass
        self.proc = None

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """One warm-up job through the whole path: the worker is up and connected."""
        self.enqueue("warmup")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.out.exists() and self.out.stat().st_size > 0:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} worker exited: see {self.workdir}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} worker not ready after {timeout_s}s")

    def close(self) -> None:
        self.stop_worker()


def now() -> float:
    return time.time()


def note(peer: Peer, msg: str) -> None:
    log(f"{peer.name}: {msg}")


class RedisTaskPeer(Peer):
    """A peer on Redis whose jobs live in one tasks module that reads ``BENCH_REDIS_URL``
    (set here for the worker's environment and for this process's import)."""

    tasks_module = ""

    def __init__(self, workdir: Path, redis_url: str) -> None:
        super().__init__(workdir)
        import redis  # bench-only peers are imported lazily; so is their driver

        os.environ["BENCH_REDIS_URL"] = redis_url
        self.env["BENCH_REDIS_URL"] = redis_url
        self.r = redis.Redis.from_url(redis_url)
        self.tasks: Any = importlib.import_module(self.tasks_module)

"""Consumer processes for the fault tests: each runs a script given the store URL, its own
log of the items it ran, and whatever else the test passes; the test SIGKILLs one (it is
started again, with a fresh log), SIGSTOPs one past its leases, and reads what all of
them ran. Used by ``test_process_faults.py`` (SQLite with an election server) and
``integration/postgres/test_postgres_faults.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path


class ConsumerFleet:
    """``count`` processes running ``script`` with ``url``, a log path and ``extra``."""

    def __init__(
        self, logs: Path, script: str, url: str, count: int, extra: Sequence[str] = ()
    ) -> None:
        self.logs = logs
        self.command = [sys.executable, "-c", script, url]
        self.extra = list(extra)
        self.env = {**os.environ, "PYTHONPATH": os.getcwd()}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for slot in range(count):
            self.spawn(slot)

    def spawn(self, slot: int) -> None:
        log = self.logs / f"ran-{slot}-{time.monotonic_ns()}.log"
        self.procs[slot] = subprocess.Popen(
            [*self.command, str(log), *self.extra],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, slot: int) -> None:
        """SIGKILL mid-whatever, then a fresh process in its slot."""
        self.procs[slot].kill()
        self.procs[slot].wait()
        self.spawn(slot)

    def pause(self, slot: int, seconds: float) -> None:
        """SIGSTOP for ``seconds`` (past its leases, when longer than they are), SIGCONT."""
        self.procs[slot].send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.procs[slot].send_signal(signal.SIGCONT)

    def ran(self) -> Counter[str]:
        """How many times each item id was run, over every process's log."""
        return Counter(
            line for log in self.logs.glob("ran-*.log") for line in log.read_text().split()
        )

    def stop(self) -> None:
        """Wake the paused, SIGTERM every process, SIGKILL one that outlives 10 s."""
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

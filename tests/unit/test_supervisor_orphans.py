"""The children of ``quick worker --processes N`` do not outlive their supervisor (issue 41
point 4), with real processes on a SQLite file.

Before, after ``kill -9`` of ``quick worker --processes 3``, 3 of 3 children kept running
and took 30 of 30 items enqueued afterwards: nobody would ever stop or restart them. Now
each child notices its parent's death (the kernel's parent-death signal on Linux, and a
watch of its parent process everywhere) and stops as on SIGTERM: what it holds is given
back, nothing new is taken.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from quickzones.client import Quick
from tests.waiting import wait_for

psutil = pytest.importorskip("psutil")

QUICK = Path(sys.executable).with_name("quick")
STARTED = re.compile(r"process (\d+) started \(pid (\d+)\)")


def _gone(pid: int) -> bool:
    """Exited (a zombie no one has reaped yet counts as exited)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_children_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    done = tmp_path / "done.txt"
    (tmp_path / "handlers.py").write_text(
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        f"    with open({str(done)!r}, 'a') as f:\n"
        "        f.write(ctx.item_id + '\\n')\n"
    )
    producer = Quick.open(f"sqlite:///{db}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    proc = subprocess.Popen(
        [str(QUICK), "worker", "--app-module", "handlers", "--processes", "3",
         "--shutdown-deadline", "5"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(proc.stdout or ()), daemon=True  # type: ignore[arg-type]
    )
    reader.start()
    children: list[int] = []
    try:

        def ran() -> set[str]:
            return set(done.read_text().split()) if done.exists() else set()

        # Up and consuming: every child started and the first items ran.
        assert wait_for(lambda: len(STARTED.findall("".join(lines))) == 3, 60), lines
        children = [int(pid) for _, pid in STARTED.findall("".join(lines))]
        first = {producer.enqueue("j", b"", app="a", tenant=f"t{n}") for n in range(6)}
        assert wait_for(lambda: first <= ran(), 60), lines
        assert all(psutil.Process(pid).ppid() == proc.pid for pid in children)

        proc.kill()  # kill -9: no chance to stop its children
        proc.wait(timeout=30)
        exited = wait_for(lambda: all(_gone(pid) for pid in children), 30)
        alive = [pid for pid in children if not _gone(pid)]
        assert exited, f"{len(alive)} of 3 children still running 30 s after the supervisor died"
        # Nothing is left to take what is enqueued now: it waits, untouched.
        later = {n: producer.enqueue("j", b"", app="a", tenant=f"t{n}") for n in range(30)}
        assert not set(later.values()) & ran()
        for n, item_id in later.items():
            item = producer.get("a", f"t{n}", item_id)
            assert item is not None and item.attempts == 0, item
    finally:
        for pid in children:  # whatever a failure left behind
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        producer.close()
    text = "".join(lines)
    assert "Traceback" not in text, text

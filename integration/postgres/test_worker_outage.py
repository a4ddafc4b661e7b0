"""``quick worker`` while its PostgreSQL server is away (issue 41 points 6 and 8), from
the user's side: a real ``quick worker`` process on a private server that the test stops
as ``pg_ctl stop -m immediate`` does.

- Point 6: SIGTERM during the outage took about 105 s against a 10 s shutdown deadline
  (the shutdown's store calls and the threads inside run()'s retry loops waited out a
  minute each). The deadline holds whatever the store does.
- Point 8: the worker said nothing for the first 45 s of an outage, even with ``-v``. It
  says at once (one WARNING, naming the error) that it lost the store, then at most once
  a while, then (INFO) that it is back.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from integration.postgres.test_postgres_faults import server
from quickzones.client import Quick
from quickzones.testing.provision.postgres import LocalPostgres
from tests.waiting import wait_for

__all__ = ["server"]  # the private server fixture, which these tests stop and restart

QUICK = Path(sys.executable).with_name("quick")
DEADLINE_S = 2.0
# What a loaded, shared machine may add to the deadline (interpreter exit, the last log
# lines); the failure this guards against took a minute or more.
MARGIN_S = 20.0


def _module(tmp_path: Path, url: str, sleep_s: float) -> None:
    (tmp_path / "handlers.py").write_text(
        "import os, time\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open({url!r})\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        f"    time.sleep({sleep_s})\n"
        f"    with open({str(tmp_path / 'done.txt')!r}, 'a') as f:\n"
        "        f.write(ctx.item_id + '\\n')\n"
    )


def _done(tmp_path: Path) -> set[str]:
    path = tmp_path / "done.txt"
    return set(path.read_text().split()) if path.exists() else set()


class Worker:
    """``quick -v worker`` in a process of its own, its output in a file."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "worker.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("QUICK_STORE", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(QUICK), "-v", "worker", "--app-module", "handlers",
                 "--shutdown-deadline", str(DEADLINE_S), "--workers", "4"],
                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def text(self, since: int = 0) -> str:
        return self.log.read_bytes()[since:].decode(errors="replace")

    def size(self) -> int:
        return self.log.stat().st_size

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def test_sigterm_during_an_outage_keeps_the_shutdown_deadline(
    tmp_path: Path, server: LocalPostgres
) -> None:
    url = f"{server.url}?schema=outage_stop"
    producer = Quick.open(url)
    _module(tmp_path, url, 1.0)
    worker = Worker(tmp_path)
    try:
        first = producer.enqueue("j", b"", app="a", tenant="t")
        assert wait_for(lambda: first in _done(tmp_path), 60), worker.text()
        # Busy: handlers running, more items held, all needing the store to end.
        for n in range(8):
            producer.enqueue("j", b"", app="a", tenant=f"t{n}")
        assert wait_for(lambda: len(_done(tmp_path)) >= 2, 60), worker.text()
        server.stop_immediate()
        producer.close()
        sent = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        try:
            code = worker.proc.wait(timeout=DEADLINE_S + MARGIN_S)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
        print(f"exit {code} after {took:.1f}s (deadline {DEADLINE_S}s)")
        assert code is not None, (
            f"still running {took:.0f}s after SIGTERM, deadline {DEADLINE_S}s:\n{worker.text()}"
        )
        assert "Traceback" not in worker.text(), worker.text()
    finally:
        worker.close()


# The CLI's log format: "date time LEVEL logger message".
LOST = re.compile(r"^\S+ \S+ WARNING \S+ .*lost.*$", re.M | re.I)
BACK = re.compile(r"^\S+ \S+ INFO \S+ .*back.*$", re.M | re.I)


def test_an_outage_is_logged_at_once_then_sparingly_then_its_end(
    tmp_path: Path, server: LocalPostgres
) -> None:
    url = f"{server.url}?schema=outage_log"
    producer = Quick.open(url)
    _module(tmp_path, url, 0.0)
    worker = Worker(tmp_path)
    try:
        first = producer.enqueue("j", b"", app="a", tenant="t")
        assert wait_for(lambda: first in _done(tmp_path), 60), worker.text()
        before = worker.size()
        server.stop_immediate()
        stopped = time.monotonic()
        # At once: the first failed attempt, not the retry loop's end a minute later.
        assert wait_for(lambda: LOST.search(worker.text(before)) is not None, 15), (
            f"nothing logged {time.monotonic() - stopped:.0f}s into the outage:\n"
            + worker.text(before)
        )
        said = LOST.search(worker.text(before))
        assert said is not None and "refused" in said.group(0), said  # names the error
        # Let the outage run past the retry loops' minute, then bring the server back.
        outage_s = 12.0
        wait_for(lambda: time.monotonic() - stopped >= outage_s, outage_s + 1)
        server.start()
        after = producer.enqueue("j", b"", app="a", tenant="t")
        assert wait_for(lambda: after in _done(tmp_path), 90), worker.text(before)
        assert wait_for(lambda: BACK.search(worker.text(before)) is not None, 30), (
            worker.text(before)
        )
        lines = worker.text(before).splitlines()
    finally:
        worker.close()
        producer.close()
    shown = "\n".join(lines[:60])
    print(f"{len(lines)} lines about a {outage_s:g}s outage:\n{shown}")
    assert not any("Traceback" in line for line in lines), shown
    records = [line for line in lines if line and not line[0].isspace()]
    warnings = [line for line in records if re.match(r"\S+ \S+ (WARNING|ERROR) ", line)]
    # One line at once, a few more with back-off over the outage: never one per attempt.
    assert len(warnings) <= 8, f"{len(warnings)} warnings about a {outage_s:g}s outage:\n{shown}"

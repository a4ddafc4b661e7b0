"""A full store under a running ``quick worker`` (issue 28 point 5): failed visits are
retried with a capped backoff, the failure is logged once with a count instead of a
traceback per visit, and the items run once there is room again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from quickzones.client import Quick
from tests.unit.helpers import cpu_seconds, fill_disk, log_records, tmpfs
from tests.waiting import wait_for

HANDLERS = """\
import os
from quickzones import Quick
quick = Quick.open(os.environ["STORE"])
@quick.job("note")
def note(payload, ctx):
    with open(os.environ["RAN"], "a") as f:
        f.write(f"{payload}\\n")
"""


def test_quick_worker_on_a_full_disk_backs_off_logs_a_count_and_recovers(
    tmp_path: Path,
) -> None:
    # Room, once freed, for the WAL to reach its checkpoint size (16 MB) and be folded in.
    with tmpfs(tmp_path / "disk", "48m") as disk:
        _full_disk_then_room(disk, tmp_path)


def _full_disk_then_room(disk: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{disk / 'quick.db'}"
    ran = tmp_path / "ran.txt"
    (tmp_path / "handlers.py").write_text(HANDLERS)
    q = Quick.open(url)
    for n in range(50):
        q.enqueue("note", n, app="a", tenant=f"t{n}")
    ballast = fill_disk(disk)
    errors = tmp_path / "worker.err"
    with open(errors, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quickzones", "worker", "--app-module", "handlers"],
            cwd=tmp_path,
            env={**os.environ, "STORE": url, "RAN": str(ran)},
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        assert wait_for(lambda: "is full" in errors.read_text()), errors.read_text()
        before, cpu_before = len(errors.read_text()), cpu_seconds(proc.pid)
        time.sleep(5)
        window = errors.read_text()[before:]
        cpu = cpu_seconds(proc.pid) - cpu_before
        records = log_records(window)
        # Before: 4,994 records (10.3 MB, a traceback each) and 3.5 s of CPU in 5 s.
        assert len(records) <= 5, (len(records), window[:2000])
        assert window.count("Traceback") == 0, window[:2000]
        assert cpu < 1.5, cpu
        assert not ran.exists()
        ballast.unlink()  # room again: every item runs
        assert wait_for(lambda: ran.exists() and len(ran.read_text().splitlines()) == 50, 90), (
            errors.read_text()[-3000:]
        )
        log = errors.read_text()
        assert "visits failed" in log and "succeed again" in log, log[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        q.close()
    assert proc.returncode == 0, errors.read_text()[-3000:]
    assert sorted(int(n) for n in ran.read_text().split()) == list(range(50))

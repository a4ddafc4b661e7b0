"""A named limit shared by three job types over ``quick worker --processes 4`` on one
SQLite file (issue 45 point 2): never more than the limit running, the limit kept full in
steady state, and a change made with ``quick limits set`` obeyed within about a second by
the running processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from quickzones.client import Quick
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")
HANDLER_S = 0.2


def _worker(tmp_path: Path, db: Path) -> subprocess.Popen[bytes]:
    """``quick worker --processes 4``: three job types naming limit 'emails', each
    writing 'type start end' lines."""
    (tmp_path / "shared.py").write_text(
        "import time\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "def run(payload, ctx):\n"
        "    start = time.time()\n"
        f"    time.sleep({HANDLER_S})\n"
        f"    with open({str(tmp_path / 'spans.txt')!r}, 'a') as f:\n"
        "        f.write(f'{ctx.item.job_type} {start} {time.time()}\\n')\n"
        "for name in ('send', 'digest', 'bounce'):\n"
        "    quick.job(name, limits=['emails'])(run)\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    cmd = [str(QUICK), "worker", "--app-module", "shared", "--workers", "4", "--processes", "4"]
    return subprocess.Popen(
        [*cmd, "--shutdown-deadline", "5"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _spans(tmp_path: Path) -> list[tuple[float, float]]:
    path = tmp_path / "spans.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(float(s), float(e)) for _, s, e in (line.split() for line in lines)]


def mean_running(spans: list[tuple[float, float]], begin: float, end: float) -> float:
    """The time-weighted mean of how many spans are open over [begin, end]."""
    covered = sum(max(0.0, min(e, end) - max(s, begin)) for s, e in spans)
    return covered / (end - begin)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def test_a_limit_of_5_shared_by_3_types_over_4_processes(tmp_path: Path) -> None:
    """Never more than 5 running; the steady state's mean is reported (target: within
    5 % of 5). Without the limit all 16 workers ran at once."""
    db = tmp_path / "w.db"
    q = Quick.open(f"sqlite:///{db}")
    try:
        q.set_limit("a", "emails", concurrency=5)
        for name in ("send", "digest", "bounce"):
            for t in range(4):
                q.enqueue_many(name, list(range(10)), app="a", tenant=f"t{t}")
        proc = _worker(tmp_path, db)
        try:
            assert wait_for(lambda: len(_spans(tmp_path)) >= 120, 180)
        finally:
            _stop(proc)
        spans = _spans(tmp_path)
        assert len(spans) == 120
        assert most_at_once(spans) == 5
        # Steady state: from the first moment 5 ran to the last start (a backlog waits).
        starts = sorted(s for s, _ in spans)
        begin, end = starts[4], starts[-1]
        mean = mean_running(spans, begin, end)
        span = end - begin
        print(f"\nsteady-state mean running {mean:.3f} of 5 ({mean / 5:.1%}) over {span:.1f} s")
        assert mean > 4.0
    finally:
        q.close()


def test_a_limit_changed_with_the_cli_is_obeyed_within_a_second(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    q = Quick.open(f"sqlite:///{db}")
    try:
        q.set_limit("a", "emails", concurrency=5)
        # A backlog that outlasts a slow start and a slow CLI (at load 10 the 180 items
        # of the first version were all done before the change took effect).
        for name in ("send", "digest", "bounce"):
            q.enqueue_many(name, list(range(200)), app="a", tenant="t")
        proc = _worker(tmp_path, db)
        try:
            # The limit full first: the 4 processes start one by one (most of a second
            # apart on a loaded host) and one alone runs at most its 4 workers.
            assert wait_for(lambda: most_at_once(_spans(tmp_path)) >= 5, 120)
            before = time.time()
            cli = [str(QUICK), "limits", "set", "emails", "--app", "a", "--concurrency", "2"]
            subprocess.run([*cli, "--store", f"sqlite:///{db}"], check=True, timeout=60)
            changed = time.time()  # committed by now
            # Within a second (the cache's refresh) plus the runs started before it.
            settled = changed + 1.0 + HANDLER_S
            assert wait_for(lambda: sum(s > settled for s, _ in _spans(tmp_path)) >= 20, 180)
        finally:
            _stop(proc)
        spans = _spans(tmp_path)
        # Before the change the limit was 5: reached, never passed.
        assert most_at_once([s for s in spans if s[1] < before]) == 5
        assert most_at_once([s for s in spans if s[0] > settled]) == 2
    finally:
        q.close()

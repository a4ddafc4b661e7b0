"""One at a time per key over ``quick worker --processes 4`` on one SQLite file (issue 45
point 1's target): of each key never two running, every item run, in enqueue order,
though the items carry priorities that would order them otherwise and 16 workers wait."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from quickzones.client import Quick
from tests.unit.helpers import most_at_once
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")
PER_KEY = 15
KEYS = ("acct-1", "acct-2")


def _worker(tmp_path: Path, db: Path) -> subprocess.Popen[bytes]:
    """``quick worker --processes 4 --workers 4``: each run appends 'key n start end'."""
    (tmp_path / "serial.py").write_text(
        "import time\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "@quick.job('sync')\n"
        "def sync(payload, ctx):\n"
        "    start = time.time()\n"
        "    time.sleep(0.05)\n"
        f"    with open({str(tmp_path / 'spans.txt')!r}, 'a') as f:\n"
        "        f.write(f\"{payload['key']} {payload['n']} {start} {time.time()}\\n\")\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    cmd = [str(QUICK), "worker", "--app-module", "serial", "--workers", "4", "--processes", "4"]
    return subprocess.Popen(
        [*cmd, "--shutdown-deadline", "5"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _runs(tmp_path: Path) -> list[tuple[str, int, float, float]]:
    path = tmp_path / "spans.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(k, int(n), float(s), float(e)) for k, n, s, e in (ln.split() for ln in lines)]


def test_one_at_a_time_per_key_over_4_processes(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    q = Quick.open(f"sqlite:///{db}")
    try:
        for n in range(PER_KEY):
            for key in KEYS:
                # A later item has a better priority: enqueue order must win all the same.
                payload = {"key": key, "n": n}
                q.enqueue("sync", payload, app="a", tenant="t", priority=-n, one_at_a_time=key)
        proc = _worker(tmp_path, db)
        try:
            assert wait_for(lambda: len(_runs(tmp_path)) >= PER_KEY * len(KEYS), 180)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        runs = _runs(tmp_path)
        assert len(runs) == PER_KEY * len(KEYS)
        for key in KEYS:
            mine = [r for r in runs if r[0] == key]
            assert most_at_once([(s, e) for _, _, s, e in mine]) == 1
            assert [n for _, n, _, _ in sorted(mine, key=lambda r: r[2])] == list(range(PER_KEY))
        gaps: list[float] = []
        for key in KEYS:
            mine = sorted((r for r in runs if r[0] == key), key=lambda r: r[2])
            gaps += [b[2] - a[3] for a, b in itertools.pairwise(mine)]
        gaps.sort()
        print(f"\nkey handover (end -> next start): median {gaps[len(gaps) // 2] * 1000:.0f} ms")
        # The two keys are not serialised with each other.
        assert most_at_once([(s, e) for _, _, s, e in runs]) == 2
        assert q.zones.count(q.zone("a", "t")) == 0
    finally:
        q.close()

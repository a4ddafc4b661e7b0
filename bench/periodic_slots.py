"""A periodic job every second, four scheduler processes, 60 s (issue 15's target).

``python -m bench.periodic_slots [--seconds 60] [--processes 4]``

Four ``quick worker`` processes on one SQLite store each run the schedule of an app module
with ``@q.periodic("* * * * * *")`` (every second, no leader). After a warm-up the run
counts the slots due in a window of ``--seconds`` seconds: the target is exactly one run
per slot (60), none twice. Results: ``bench/results/<UTC timestamp>-periodic/periodic.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

from bench.common import child_env, log, machine, run_folder
from quickzones.testing.provision.process import terminate_all

APP = textwrap.dedent(
    """
    import os, pathlib
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_STORE"])
    log = pathlib.Path(os.environ["RUN_LOG"])

    @q.periodic("* * * * * *", job="tick", app="a", tenant="t", name="every-second")
    def tick(payload, ctx):
        with log.open("a") as f:
            f.write(ctx.item_id + "\\n")
    """
)


def run(seconds: int, processes: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="quick-periodic-") as tmp:
        work = Path(tmp)
        (work / "cronapp.py").write_text(APP)
        runs_log = work / "runs.log"
        runs_log.touch()
        env = child_env(QUICK_STORE=f"sqlite:///{work / 'q.db'}", RUN_LOG=str(runs_log))
        cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "cronapp:q",
               "--workers", "2", "--managers", "1"]  # fmt: skip
        procs = [subprocess.Popen(cmd, cwd=work, env=env) for _ in range(processes)]
        try:
            time.sleep(5)  # every process up and ticking
            start_ms = (int(time.time()) + 1) * 1000
            end_ms = start_ms + seconds * 1000
            time.sleep((end_ms - time.time() * 1000) / 1000 + 3)  # the last slot has run
        finally:
            terminate_all(procs)
        slots = Counter(int(line.rsplit(":", 1)[1]) for line in runs_log.read_text().split())
    window = {s: n for s, n in slots.items() if start_ms <= s < end_ms}
    return {
        "seconds": seconds,
        "processes": processes,
        "slots_in_window": seconds,
        "runs_in_window": sum(window.values()),
        "slots_run": len(window),
        "slots_run_twice": sum(1 for n in window.values() if n > 1),
        "slots_missed": seconds - len(window),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    result = run(args.seconds, args.processes)
    out = run_folder("periodic")
    (out / "periodic.json").write_text(json.dumps({"machine": machine(), **result}, indent=2))
    log(f"periodic: {json.dumps(result)} -> {out}")


if __name__ == "__main__":
    main()

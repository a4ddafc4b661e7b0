"""A handler that crashes its own process: each redelivery after the crash is the next
attempt (``ctx.attempt``), and once its started runs' leases lapsed ``max_lapses`` times
the item is dead-lettered instead of crashing every consumer forever (issue 12 point 17;
a lapse is no failed attempt, issue 27 point 1.2)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from quickzones.client import Quick

CONSUMER = textwrap.dedent(
    """
    import os, sys
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    from quickzones.registry import RetryPolicy

    url, log_path = sys.argv[1], sys.argv[2]
    q = Quick.open(url)

    @q.job("crash", retry=RetryPolicy(max_lapses=3))
    def crash(payload, ctx):
        with open(log_path, "a") as f:
            f.write(f"{ctx.attempt}\\n")
        os._exit(17)  # the whole consumer process dies mid-handler

    q.consumer(ConsumerConfig(item_lease_s=1.0, idle_sleep_s=0.01, in_order=True)).run_forever()
    """
)


def test_handler_crashing_its_process_is_dead_lettered_after_max_lapses(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    log = tmp_path / "attempts.log"
    q = Quick.open(url)
    item_id = q.enqueue("crash", b"", app="app", tenant="t1")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    crashes = 0
    deadline = time.time() + 120
    while time.time() < deadline and not q.dead_letters():
        proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, url, str(log)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.time() + 10
        while proc.poll() is None and time.time() < end and not q.dead_letters():
            time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        elif proc.returncode == 17:
            crashes += 1
    attempts = log.read_text().split() if log.exists() else []
    print(f"crashes {crashes}, attempts seen {attempts}")
    [dead] = q.dead_letters()
    assert dead.item_id == item_id and "lapsed 3 times, never released" in dead.reason
    # Each crashed run is a lapse, not an attempt: every run was attempt 1.
    assert attempts == ["1", "1", "1"]
    assert q.get("app", "t1", item_id) is None

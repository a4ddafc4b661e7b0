"""A worker never settles what it cannot run (issue 41 point 3), through ``quick worker``
with real processes on a SQLite file.

Before, a module that registered no job type started (its banner said "job types ;")
and, once the unhandled grace passed, dead-lettered every item it saw: other apps'
items it was never meant to run. Now ``quick worker`` refuses to start without a job
type, and a worker leaves an item of a type it has no handler for where it is (never
dead-lettered, retried or completed by it; no attempt counted), however long it waits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from quickzones.client import Quick
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("QUICK_STORE", None)
    return env


def test_a_worker_with_no_job_types_refuses_to_start(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    (tmp_path / "empty.py").write_text(
        f"from quickzones import Quick\nquick = Quick.open('sqlite:///{db}')\n"
    )
    producer = Quick.open(f"sqlite:///{db}")
    item = producer.enqueue("someone_elses", b"", app="other", tenant="t")
    try:
        out = subprocess.run(
            [str(QUICK), "worker", "--app-module", "empty", "--unhandled-grace", "0"],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"started and ran with no job type:\n{err.stdout!r}") from None
    said = out.stdout + out.stderr
    assert out.returncode != 0, said
    assert "empty" in said and "no job type" in said and "@quick.job" in said, said
    assert "Traceback" not in said, said
    assert producer.dead_letters() == []
    left = producer.get("other", "t", item)
    assert left is not None and left.attempts == 0
    producer.close()


def test_a_worker_leaves_items_of_types_it_does_not_run_past_the_grace(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    done = tmp_path / "done.txt"
    (tmp_path / "handlers.py").write_text(
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "@quick.job('t1')\n"
        "def t1(payload, ctx):\n"
        f"    with open({str(done)!r}, 'a') as f:\n"
        "        f.write(ctx.item_id + '\\n')\n"
    )
    producer = Quick.open(f"sqlite:///{db}")
    # Items of t2 first, in the zones the worker visits for t1: each visit sees them.
    strangers = [producer.enqueue("t2", b"", app="a", tenant=f"z{n}") for n in range(3)]
    proc = subprocess.Popen(
        [str(QUICK), "worker", "--app-module", "handlers", "--apps", "a",
         "--unhandled-grace", "0", "--shutdown-deadline", "5"],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:

        def ran() -> set[str]:
            return set(done.read_text().split()) if done.exists() else set()

        # Two rounds of t1 items in the same zones, so the t2 items are seen past the
        # grace (0 s) more than once.
        for _ in range(2):
            mine = {producer.enqueue("t1", b"", app="a", tenant=f"z{n}") for n in range(3)}
            assert wait_for(lambda mine=mine: mine <= ran(), 60)
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert producer.dead_letters() == [], output
    for item_id in strangers:
        left = producer.get("a", f"z{strangers.index(item_id)}", item_id)
        assert left is not None, f"{item_id} settled by a worker that cannot run it:\n{output}"
        assert left.attempts == 0 and left.error_count == 0, (left, output)
    assert "'t2'" in output, output  # said that it does not run t2
    producer.close()

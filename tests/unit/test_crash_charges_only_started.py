"""A crash charges only what it interrupted (issue 40 point 1).

A consumer process holding items it leased and never started is SIGKILLed three times:
each item that never started is still queued with no attempt and no lapse counted, and
finally runs (attempt 1); the one item whose handler started (and blocks) each time counts
one attempt or lapse per crash, and is dead-lettered after ``max_lapses`` of them.

On the unchanged code, every item leased at once counted (attempts + 1 at the grant, a
lapse at each re-grant), so three crashes of a consumer holding prefetched items
dead-lettered all of them, none ever having run. Parametrized: the default
``processing_bound`` (nothing leased beyond what the workers start) and an explicit
look-ahead of 16 (items leased to wait: held unstarted in the store, counted when they
start).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.registry import JobContext, RetryPolicy
from tests.waiting import wait_for

CONSUMER = textwrap.dedent(
    """
    import os, sys, time, pathlib
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig
    q = Quick.open(sys.argv[1])
    starts = pathlib.Path(sys.argv[2])
    bound = None if sys.argv[3] == "default" else int(sys.argv[3])

    @q.job("job")
    def job(payload, ctx):
        with starts.open("a") as f:
            f.write(f"{os.getpid()} {ctx.item_id}\\n")
        if payload == "block":
            time.sleep(3600)

    config = ConsumerConfig(
        workers=1, item_lease_s=1.0, idle_sleep_s=0.01, processing_bound=bound
    )
    q.consumer(config).run_forever()
    """
)

OTHERS = 15


def _started(starts: Path) -> list[tuple[int, str]]:
    """(pid, item id) of each handler start the consumers wrote, complete lines only."""
    if not starts.exists():
        return []
    out = []
    for line in starts.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            pid, item_id = line.split()
            out.append((int(pid), item_id))
    return out


@pytest.mark.parametrize("bound", ["default", "16"])
def test_three_crashes_charge_only_the_item_that_ran(tmp_path: Path, bound: str) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    starts = tmp_path / "starts"
    q = Quick.open(url)
    # First in every visit (a lower priority number goes first): the worker starts it and
    # blocks, and whatever else a visit leased waits.
    blocker = q.enqueue("job", "block", app="a", tenant="t", priority=-1)
    others = [q.enqueue("job", n, app="a", tenant="t") for n in range(OTHERS)]
    zone = q.zone("a", "t")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for _crash in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, url, str(starts), bound],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            assert wait_for(lambda p=proc: (p.pid, blocker) in _started(starts), timeout=60), (
                "the consumer never started the blocking item"
            )
            item = q.get("a", "t", blocker)
            assert item is not None
            first = item.vesting_ms
            # Its lease was renewed: the consumer has been up a while since the blocking
            # item started, time enough for its scans to lease whatever they would.
            assert wait_for(
                lambda f=first: (i := q.get("a", "t", blocker)) is not None and i.vesting_ms > f,
                timeout=30,
            )
            if bound != "default":
                # The look-ahead holds every item left (leased, waiting for the worker).
                assert wait_for(
                    lambda: all(
                        (i := q.get("a", "t", x)) is None or i.lease_id is not None
                        for x in others
                    ),
                    timeout=30,
                )
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            # The next consumer starts once the blocking item's lease has run out, so its
            # first visit takes that item first again: started before its lease ran out, it
            # would run the others meanwhile and leave nothing held to check.
            assert wait_for(
                lambda: any(i.item_id == blocker for i in q.zones.peek(zone, OTHERS + 1)),
                timeout=30,
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    # Three crashes: what never started still waits to run, nothing counted against it.
    ran_before = {item_id for _, item_id in _started(starts)}
    for item_id in others:
        item = q.get("a", "t", item_id)
        if item is None:
            assert item_id in ran_before  # it ran (and completed) before a crash
            continue
        if item_id in ran_before:
            continue  # started before a crash: its own run was interrupted
        assert (item.attempts, item.lapses, item.error_count) == (0, 0, 0), item
    held = q.get("a", "t", blocker)
    assert held is not None
    # Started three times: the first grant counted the run, each later one a lapse.
    assert (held.attempts, held.lapses, held.error_count) == (1, 2, 0)

    attempts: dict[str, int] = {}

    @q.job("job", retry=RetryPolicy(max_lapses=3))
    def job(payload: object, ctx: JobContext) -> None:
        attempts[ctx.item_id] = ctx.attempt

    left = q.zones.count(zone)
    # The crashed consumers' leases run out (1 s), and every item left is vested again.
    assert wait_for(lambda: len(q.zones.peek(zone, 100)) == left, timeout=30)
    q.run_until_idle(ConsumerConfig(in_order=True))
    letters = q.dead_letters("a")
    q.close()
    # The blocking item's third crash is its third lapse: dead-lettered, not run again.
    assert [letter.item_id for letter in letters] == [blocker]
    assert letters[0].item is not None and letters[0].item.lapses == 3
    assert "lapsed 3 times" in letters[0].reason
    # Every other item ran, each as its first attempt.
    never_ran = [x for x in others if x not in ran_before]
    assert never_ran, "the consumers ran every item before a crash: nothing was held"
    assert {x: attempts.get(x) for x in never_ran} == dict.fromkeys(never_ran, 1)

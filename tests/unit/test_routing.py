"""Issue 15 point 4: routing. A consumer limited to apps and job types; an item of a type a
consumer does not handle goes to one that does, with no attempt counted, and is never
settled by a consumer that cannot run it (issue 41 point 3), only reported after a grace
period."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer import Consumer, ConsumerConfig
from quickzones.errors import ConfigurationError
from quickzones.registry import JobContext, Registry
from tests.waiting import wait_for

RANDOM = ConsumerConfig(in_order=False)


def lacking(q: Quick, config: ConsumerConfig = RANDOM, name: str = "lacking") -> Consumer:
    """A real consumer of the same store whose process has no handlers at all."""
    return Consumer(
        q.item_store(), q.toplevel, Registry(), kv=q.kv, config=config, clock=q.clock, name=name
    )


def record(q: Quick, job_type: str, seen: list[tuple[str, int, int]]) -> None:
    def handler(payload: Any, ctx: JobContext) -> None:
        seen.append((ctx.item_id, ctx.item.attempts, ctx.item.error_count))

    q.job(job_type)(handler)


def test_consumer_without_handler_gives_item_to_one_with_it_no_attempt_counted(
    q: Quick, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, int, int]] = []
    record(q, "new-type", seen)
    ids = [q.enqueue("new-type", b"x", app="a", tenant=f"t{i}") for i in range(3)]
    old = lacking(q)
    with caplog.at_level(logging.WARNING, logger="quick"):
        assert old.run_until_idle() == 0
        assert old.run_until_idle() == 0
    for item_id, tenant in zip(ids, ("t0", "t1", "t2"), strict=True):
        item = q.get("a", tenant, item_id)
        assert item is not None and item.attempts == 0 and item.error_count == 0
        assert item.lease_id is None
    assert old.stats["unknown_job_type"] >= 3  # counted every time: the metric
    warned = [r for r in caplog.records if "new-type" in r.getMessage()]
    assert len(warned) == 1  # logged once per type
    assert q.dead_letters() == []

    new = q.consumer(RANDOM, name="new")
    assert new.run_until_idle() == 3
    assert sorted(seen) == sorted((i, 1, 0) for i in ids)  # the first attempt, no error


def test_two_running_consumers_one_without_the_handler(q: Quick) -> None:
    seen: list[tuple[str, int, int]] = []
    record(q, "j", seen)
    ids = {q.enqueue("j", b"", app="a", tenant=f"t{i % 4}") for i in range(20)}
    old = lacking(q, ConsumerConfig(in_order=False, workers=2, idle_sleep_s=0.005))
    new = q.consumer(ConsumerConfig(in_order=False, workers=2, idle_sleep_s=0.005), name="new")
    old.start()
    new.start()
    try:
        assert wait_for(lambda: len(seen) >= 20)
    finally:
        old.stop(5)
        new.stop(5)
    assert {s[0] for s in seen} == ids and len(seen) == 20
    assert all(attempts == 1 and errors == 0 for _, attempts, errors in seen)
    assert old.stats["unknown_job_type"] >= 1 and "started" not in old.stats


def test_unhandled_item_never_settled_and_reported_after_the_grace(
    q: Quick, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41 point 3: a consumer that cannot run a type never settles its items (it
    cannot know that no other consumer runs it); past the grace it says so at ERROR."""
    item_id = q.enqueue("nobody", b"", app="a", tenant="t")
    old = lacking(q, ConsumerConfig(in_order=False, unhandled_grace_s=60))
    with caplog.at_level(logging.WARNING, logger="quick.consumer"):
        old.run_until_idle()
        clock.advance(59)
        old.run_until_idle()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        clock.advance(2)
        old.run_until_idle()
        clock.advance(10**6)
        old.run_until_idle()
    assert q.dead_letters() == []
    item = q.get("a", "t", item_id)
    assert item is not None and item.attempts == 0 and item.error_count == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "'nobody'" in errors[0] and "stays queued" in errors[0], errors


def test_no_grace_never_dead_letters(q: Quick, clock: ManualClock) -> None:
    item_id = q.enqueue("nobody", b"", app="a", tenant="t")
    old = lacking(q, ConsumerConfig(in_order=False, unhandled_grace_s=None))
    clock.advance(10**6)
    old.run_until_idle()
    assert q.dead_letters() == [] and q.get("a", "t", item_id) is not None


def test_grace_counts_from_when_a_delayed_item_became_due(q: Quick, clock: ManualClock) -> None:
    q.enqueue("nobody", b"", app="a", tenant="t", delay=100)
    old = lacking(q, ConsumerConfig(in_order=False, unhandled_grace_s=60))
    clock.advance(101)
    old.run_until_idle()
    assert q.dead_letters() == []


def test_consumer_limited_to_job_types(q: Quick) -> None:
    seen_a: list[tuple[str, int, int]] = []
    seen_b: list[tuple[str, int, int]] = []
    record(q, "a", seen_a)
    record(q, "b", seen_b)
    q.enqueue("a", b"", app="x", tenant="t")
    b_id = q.enqueue("b", b"", app="x", tenant="t")
    only_a = q.consumer(ConsumerConfig(in_order=False, job_types=("a",)))
    assert only_a.run_until_idle() == 1
    assert len(seen_a) == 1 and seen_b == []
    item = q.get("x", "t", b_id)
    assert item is not None and item.attempts == 0
    assert q.consumer(RANDOM).run_until_idle() == 1 and len(seen_b) == 1


def test_consumer_limited_to_apps_does_not_lease_other_apps_zones(q: Quick) -> None:
    seen: list[tuple[str, int, int]] = []
    record(q, "j", seen)
    mine = q.enqueue("j", b"", app="mine", tenant="t")
    theirs = q.enqueue("j", b"", app="theirs", tenant="t")
    events: list[tuple[str, dict[str, Any]]] = []
    only_mine = q.consumer(ConsumerConfig(in_order=False, apps=("mine",)))
    only_mine.observer = lambda event, fields: events.append((event, fields))
    for _ in range(3):
        only_mine.run_until_idle()
    assert [s[0] for s in seen] == [mine]
    refused = [f for e, f in events if e == "pointer_lease_failed"]
    assert [f["reason"] for f in refused] == ["not_routed"]  # then the scanner skips it
    leased = [f["zone"].app for e, f in events if e == "pointer_leased"]
    assert "theirs" not in leased
    assert q.consumer(RANDOM).run_until_idle() == 1 and seen[-1][0] == theirs


def test_routed_consumer_stays_out_of_the_clusters_in_order_election(q: Quick) -> None:
    """A routed consumer scans in order only for the consumers routed alike (issue 40
    point 5, tests/unit/test_in_order_fleets.py), never as the cluster's in-order scanner:
    a consumer that takes everything is elected for that one at the same time."""
    routed = q.consumer(ConsumerConfig(apps=("a",)))
    routed.refresh_election()
    assert routed.in_order  # the only consumer routed to "a"
    everything = q.consumer(ConsumerConfig())
    everything.refresh_election()
    assert everything.in_order


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"apps": ()}, "apps must name at least one"),
        ({"job_types": "j"}, "job_types must be a tuple"),
        ({"apps": ("",)}, "apps must be a tuple of non-empty names"),
        ({"unhandled_grace_s": -1.0}, "unhandled_grace_s"),
    ],
)
def test_bad_routing_config(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ConsumerConfig(**changes).validate()


def test_routing_to_a_type_without_a_handler_is_refused(q: Quick) -> None:
    q.job("j")(lambda payload, ctx: None)
    with pytest.raises(ConfigurationError, match=r"'jj'.*no handler; registered: j"):
        q.consumer(ConsumerConfig(job_types=("j", "jj")))


# --- the CLI ----------------------------------------------------------------------------


def handlers(tmp_path: Path) -> None:
    (tmp_path / "route_handlers.py").write_text(
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{tmp_path / 'w.db'}')\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        "    pass\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--types", "nope"], "'nope'"),
        (["--types", "j,,j"], "--types"),
        (["--apps", ""], "--apps"),
        (["--apps", " , "], "--apps"),
        (["--unhandled-grace", "-3"], "--unhandled-grace"),
    ],
)
def test_worker_bad_routing_options_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    handlers(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUICK_STORE", raising=False)
    result = CliRunner().invoke(main, ["worker", "--app-module", "route_handlers", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.stderr


def test_worker_routing_options_reach_the_consumer(tmp_path: Path) -> None:
    handlers(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "QUICK_STORE"}
    quick = Path(sys.executable).with_name("quick")
    proc = subprocess.Popen(
        [
            str(quick), "worker", "--app-module", "route_handlers", "--apps", "a, b",
            "--types", "j", "--unhandled-grace", "30",
        ],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert "apps a, b" in first and "job types j" in first and "grace 30s" in first, first
    # SIGTERM may come before the worker installs its handler: either way it stopped.
    assert proc.returncode in (0, -signal.SIGTERM)

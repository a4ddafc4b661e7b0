"""Periodic jobs (issue 15 point 1): cron schedules run by any number of schedulers with no
leader, one item per slot, catch-up after downtime, time zones, ``quick periodic list``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import ConfigurationError, InvalidArgument
from quickzones.registry import JobContext
from quickzones.store.records import ZoneId
from quickzones.testing.provision.process import terminate_all
from tests.conftest import store_url

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC).timestamp()


def _set(clock: ManualClock, t: float) -> None:
    clock.advance(t - clock.now())


def _every_second(q: Quick, runs: list[str], **options: str) -> None:
    @q.periodic("* * * * * *", job="tick", app="a", tenant="t", payload={"k": 1}, **options)
    def tick(payload: object, ctx: JobContext) -> None:
        runs.append(ctx.item_id)


def _zone_ids(q: Quick) -> list[str]:
    return sorted(i.item_id for i in q.items.peek(ZoneId("a", "t"), 10_000))


def test_four_schedulers_produce_one_item_per_slot(
    backend: str, tmp_path: Path, clock: ManualClock
) -> None:
    _set(clock, T0)
    url = store_url(backend, tmp_path)
    first = Quick.open(url, clock=clock)
    # memory:// is one process's store: the four clients share it as four processes
    # share a file or a cluster.
    clients = [first] + [
        Quick(first.kv, clock=clock) if backend != "sqlite" else Quick.open(url, clock=clock)
        for _ in range(3)
    ]
    runs: list[str] = []
    for c in clients:
        _every_second(c, runs)
    schedulers = [c.scheduler(lookahead_s=0) for c in clients]
    for s in schedulers:
        s.tick()  # first sight: the schedule starts at the next slot
    for step in range(40):  # 10 s in quarter seconds; every scheduler ticks every time
        clock.advance(0.25)
        for s in schedulers[step % 4 :] + schedulers[: step % 4]:
            s.tick()
    ids = _zone_ids(first)
    slots = [int(i.rsplit(":", 1)[1]) for i in ids]
    assert slots == [int((T0 + n) * 1000) for n in range(1, 11)]
    first.run_until_idle()
    assert sorted(runs) == ids  # each ran once
    for s in schedulers:  # completed slots are not enqueued again
        s.tick()
    assert _zone_ids(first) == []
    for c in clients:
        c.close()


def test_catch_up_latest_by_default_or_all(q: Quick, clock: ManualClock) -> None:
    _set(clock, T0)
    runs: list[str] = []
    _every_second(q, runs, name="latest")

    @q.periodic("* * * * * *", job="tick", app="a", tenant="t", name="all", catch_up="all")
    def _unused(payload: object, ctx: JobContext) -> None:
        raise AssertionError("the first registration is the handler")

    sched = q.scheduler(lookahead_s=0)
    sched.tick()
    clock.advance(30)  # thirty slots missed while nothing ran
    assert sched.tick() == 1 + 30
    ids = _zone_ids(q)
    assert [i for i in ids if i.startswith("periodic:latest:")] == [
        f"periodic:latest:{int((T0 + 30) * 1000)}"
    ]
    assert len([i for i in ids if i.startswith("periodic:all:")]) == 30


def test_time_zone_is_honoured(q: Quick, clock: ManualClock) -> None:
    q.periodic("0 9 * * *", job="morning", app="a", tenant="t", tz="Europe/Paris")
    sched = q.scheduler()
    (winter,) = q.schedules
    jan = int(datetime(2026, 1, 10, tzinfo=UTC).timestamp() * 1000)
    jul = int(datetime(2026, 7, 10, tzinfo=UTC).timestamp() * 1000)
    assert datetime.fromtimestamp(winter.slots_after(jan, 1)[0] / 1000, UTC).hour == 8
    assert datetime.fromtimestamp(winter.slots_after(jul, 1)[0] / 1000, UTC).hour == 7
    _set(clock, jan / 1000)
    assert len(sched.next_runs(winter, 3)) == 3


def _utc(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def test_a_fixed_time_job_runs_once_on_the_night_the_clocks_go_back(
    q: Quick, clock: ManualClock
) -> None:
    """Paris, 25 October 2026: 02:30 happens twice (CEST, then CET). A nightly 02:30 job
    runs once, at the first (cron's rule for fixed-time jobs); one every 30 minutes keeps
    its real-time interval through the repeated hour. On the spring night, when 02:30
    never happens, the nightly job runs once, at 03:00."""
    runs: list[str] = []

    @q.periodic("30 2 * * *", job="nightly", app="a", tenant="t", tz="Europe/Paris")
    def nightly(payload: object, ctx: JobContext) -> None:
        runs.append(ctx.item_id)

    q.periodic("*/30 * * * *", job="nightly", app="a", tenant="h", tz="Europe/Paris")
    fixed, every_30 = q.schedules
    sched = q.scheduler()
    _set(clock, _utc(2026, 10, 24, 12) / 1000)
    sched.tick()  # first sight: starts at the next slot
    for hour in range(6, 52):  # a tick every hour through the night and the next day
        _set(clock, _utc(2026, 10, 24, 0) / 1000 + hour * 3600)
        sched.tick()
        q.run_until_idle()
    assert [int(r.rsplit(":", 1)[1]) for r in runs if "@a/t@" in r] == [
        _utc(2026, 10, 25, 0, 30),  # 02:30 CEST; not again at 01:30 UTC (02:30 CET)
        _utc(2026, 10, 26, 1, 30),
    ]
    night = every_30.slots_between(_utc(2026, 10, 25, 0, 0), _utc(2026, 10, 25, 2, 0), 10)
    assert night == [_utc(2026, 10, 25, 0, 0) + n * 1_800_000 for n in range(1, 5)]
    spring = fixed.slots_after(_utc(2026, 3, 28, 12), 2)
    assert spring == [_utc(2026, 3, 29, 1, 0), _utc(2026, 3, 30, 0, 30)]


def test_slot_is_enqueued_ahead_to_vest_on_time(q: Quick, clock: ManualClock) -> None:
    _set(clock, T0 + 0.6)
    q.periodic("* * * * * *", job="tick", app="a", tenant="t")
    sched = q.scheduler(lookahead_s=0.5)
    sched.tick()
    clock.advance(0.1)  # T0 + 0.7: the slot at T0 + 1 is within the lookahead
    assert sched.tick() == 1
    item = q.get("a", "t", f"periodic:tick@a/t@* * * * * *:{int((T0 + 1) * 1000)}")
    assert item is not None and item.vesting_ms == int((T0 + 1) * 1000)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cron": "every day"}, "cron"),
        ({"tz": "Mars/Olympus"}, "tz"),
        ({"catch_up": "some"}, "catch_up"),
        ({"payload": object()}, "payload"),
        ({"name": ""}, "schedule name"),
    ],
)
def test_bad_schedules_are_refused(q: Quick, options: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"cron": "* * * * *", "job": "j", "app": "a", "tenant": "t"}
    args.update(options)
    with pytest.raises(InvalidArgument) as err:
        q.periodic(**args)  # type: ignore[arg-type]
    assert err.value.name == field
    assert q.schedules == []


def test_a_sixth_field_is_seconds_last_as_croniter_reads_it(q: Quick) -> None:
    q.periodic("* * * * * */10", job="j", app="a", tenant="t", name="ten")
    [every_10s] = q.schedules
    start = 1_800_000_000_000  # a whole minute
    assert every_10s.slots_after(start, 3) == [start + 10_000, start + 20_000, start + 30_000]
    # "*/2 * * * * *" meant as "every 2 seconds" (seconds first, Quartz's order) would
    # run every second of every other minute: refused, saying how quick reads it.
    with pytest.raises(InvalidArgument) as err:
        q.periodic("*/2 * * * * *", job="j", app="a", tenant="t", name="typo")
    assert err.value.name == "cron" and "seconds are the sixth field" in str(err.value)
    assert "* * * * * */2" in str(err.value)
    # Meant: every second of every other minute, written out.
    q.periodic("*/2 * * * * 0-59", job="j", app="a", tenant="t", name="meant")
    assert [s.name for s in q.schedules] == ["ten", "meant"]


def test_same_schedule_name_twice_is_refused(q: Quick) -> None:
    q.periodic("* * * * *", job="j", app="a", tenant="t", name="n")
    with pytest.raises(ConfigurationError):
        q.periodic("*/5 * * * *", job="j", app="a", tenant="t", name="n")


APP = textwrap.dedent(
    """
    import os, pathlib
    from quickzones.client import Quick

    q = Quick.open(os.environ["QUICK_STORE"])
    log = pathlib.Path(os.environ["RUN_LOG"])

    # catch_up="all": under "latest" a scheduler stalled past a slot (four processes on a
    # loaded two-core CI host) coalesces it away by design, and this app's test counts slots.
    @q.periodic("* * * * * *", job="tick", app="a", tenant="t", name="every-second",
                catch_up="all")
    def tick(payload, ctx):
        with log.open("a") as f:  # one short appended line: never read half-written
            f.write(ctx.item_id + "\\n")
    """
)


def test_periodic_list_shows_next_runs(tmp_path: Path) -> None:
    (tmp_path / "cronapp.py").write_text(APP)
    env = {"QUICK_STORE": f"sqlite:///{tmp_path / 'q.db'}", "RUN_LOG": str(tmp_path / "log")}
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        sys.modules.pop("cronapp", None)
        out = CliRunner(env=env).invoke(
            main, ["periodic", "list", "--app-module", "cronapp:q", "--json", "--count", "2"]
        )
    finally:
        os.chdir(old)
        sys.modules.pop("cronapp", None)
    assert out.exit_code == 0, out.output
    (doc,) = json.loads(out.output)
    assert doc["name"] == "every-second" and doc["cron"] == "* * * * * *"
    assert len(doc["next_runs"]) == 2 and doc["last_enqueued"] is None


def test_periodic_list_shows_next_runs_in_the_schedules_time_zone(tmp_path: Path) -> None:
    """A schedule read in Europe/Paris: its next runs in Paris time with the offset, so
    "0 3 * * *" reads as 03:00 (the JSON keeps UTC beside them)."""
    (tmp_path / "parisapp.py").write_text(
        "import os\nfrom quickzones.client import Quick\n"
        "q = Quick.open(os.environ['QUICK_STORE'])\n"
        "q.periodic('0 3 * * *', job='nightly', app='a', tenant='t', tz='Europe/Paris')"
        "(lambda payload, ctx: None)\n"
    )
    env = {"QUICK_STORE": f"sqlite:///{tmp_path / 'q.db'}", "COLUMNS": "300"}
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        sys.modules.pop("parisapp", None)
        runner = CliRunner(env=env)
        table = runner.invoke(main, ["periodic", "list", "--app-module", "parisapp:q"])
        sys.modules.pop("parisapp", None)
        doc = runner.invoke(main, ["periodic", "list", "--app-module", "parisapp:q", "--json"])
    finally:
        os.chdir(old)
        sys.modules.pop("parisapp", None)
    assert table.exit_code == 0 and doc.exit_code == 0, table.output + doc.output
    (sched,) = json.loads(doc.output)
    local = [datetime.fromisoformat(t) for t in sched["next_runs_local"]]
    assert [(t.hour, t.minute) for t in local] == [(3, 0)] * 3
    offsets = {t.utcoffset() for t in local}
    assert offsets <= {timedelta(hours=1), timedelta(hours=2)}, offsets  # CET or CEST
    utc = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in sched["next_runs"]]
    assert utc == local  # the same moments
    assert sched["next_runs_local"][0] in table.output


def test_four_worker_processes_run_each_slot_once(tmp_path: Path) -> None:
    (tmp_path / "cronapp.py").write_text(APP)
    log = tmp_path / "runs.log"
    log.touch()
    env = {**os.environ, "QUICK_STORE": f"sqlite:///{tmp_path / 'q.db'}", "RUN_LOG": str(log)}
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module", "cronapp:q"]
    procs = [
        subprocess.Popen([*cmd, "--workers", "2", "--managers", "1"], cwd=tmp_path, env=env)
        for _ in range(4)
    ]
    try:
        time.sleep(10)
    finally:
        terminate_all(procs)
    runs = log.read_text().split()
    assert len(runs) == len(set(runs)), "a slot ran twice"
    assert len(runs) >= 3, f"too few runs in 10 s: {runs}"
    # Slots enqueued but not run when the workers stopped are still queued, once each.
    q = Quick.open(env["QUICK_STORE"])
    zone = ZoneId("a", "t")
    rows = q.transact(lambda tr: tr.get_range(*q.keys.items_range(zone)))
    left = [str(k[-1]) for k in (q.keys.unpack(key) for key, _ in rows) if len(k) == 5]
    q.close()
    assert not set(left) & set(runs)
    # Exactly one item per slot: every slot from the first to the last, none skipped.
    slots = sorted(int(i.rsplit(":", 1)[1]) for i in runs + left)
    assert slots == list(range(slots[0], slots[-1] + 1000, 1000))


NIGHTLY = (
    "import os\nfrom quickzones.client import Quick\n"
    "q = Quick.open(os.environ['QUICK_STORE'])\n"
    "q.periodic('0 3 * * *', job='nightly', app='a', tenant='t', name='nightly')"
    "(lambda payload, ctx: None)\n"
)


def test_periodic_list_does_not_show_a_first_tick_as_enqueued(tmp_path: Path) -> None:
    """Issue 28 point 12: a new schedule's first tick enqueues nothing; `quick periodic
    list` must not show it as "last enqueued" until a slot is enqueued."""
    (tmp_path / "nightlyapp.py").write_text(NIGHTLY)
    url = f"sqlite:///{tmp_path / 'q.db'}"
    env = {"QUICK_STORE": url}

    def listed() -> dict[str, object]:
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            sys.modules.pop("nightlyapp", None)
            out = CliRunner(env=env).invoke(
                main, ["periodic", "list", "--app-module", "nightlyapp:q", "--json"]
            )
        finally:
            os.chdir(old)
            sys.modules.pop("nightlyapp", None)
        assert out.exit_code == 0, out.output
        (doc,) = json.loads(out.output)
        return dict(doc)

    clock = ManualClock(datetime(2026, 1, 5, 12, 0, 0, 250_000, tzinfo=UTC).timestamp())
    worker = Quick.open(url, clock=clock)
    worker.periodic("0 3 * * *", job="nightly", app="a", tenant="t", name="nightly")(
        lambda payload, ctx: None
    )
    scheduler = worker.scheduler()
    assert scheduler.tick() == 0  # first sight: nothing enqueued
    assert listed()["last_enqueued"] is None
    _set(clock, datetime(2026, 1, 6, 3, 0, 1, tzinfo=UTC).timestamp())
    assert scheduler.tick() == 1
    assert listed()["last_enqueued"] == "2026-01-06T03:00:00.000Z"
    worker.close()

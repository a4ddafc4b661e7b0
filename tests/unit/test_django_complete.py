"""Django's tasks framework, completed (issue 45 point 5), from a Django user's side, on the
tiny project of tests/django_project: retries with backoff (per backend, and per task
through the backend's ``task_retry`` option), a retried task's result (its status, its
attempts, its times in order), Django's priority run in quick's order, and ``python
manage.py quick_worker`` running the project's tasks until SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_django_tasks import (
    PROJECT,
    _django,
    _env,
    _wait_finished,
    worker_of,  # noqa: F401  (the fixture)
)

# One result as Django's API shows it, read in a process of its own (not the worker's).
_READ_ONE = """
r = default_task_backend.get_result(RID)
out = {
    "status": str(r.status), "attempts": r.attempts, "worker_ids": list(r.worker_ids),
    "errors": [[e.exception_class_path, e.traceback] for e in r.errors],
    "times": [None if t is None else t.timestamp() for t in (
        r.enqueued_at, r.started_at, r.last_attempted_at, r.finished_at)],
}
"""
# Django's TaskResult keeps the first failed run's error and the newest ones: 1 + 4.
KEPT_ERRORS = 5

# The flaky task fails until its third run; the backend's own policy allows two runs.
FLAKY_RETRY = {"max_attempts": 3, "backoff_base_s": 0.5, "backoff_cap_s": 60, "jitter": False}
BACKEND_RETRY = {"max_attempts": 2, "backoff_base_s": 0.1, "jitter": False}


def _runs(tmp_path: Path, name: str) -> list[list[str]]:
    log = tmp_path / "runs.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split() for line in lines if line.startswith(name + " ")]


def test_retries_with_backoff_per_backend_and_per_task(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """A task that fails twice then succeeds runs three times, each retry after its
    backoff (0.5 s, then 1 s: base * 2**(errors - 1), no jitter), and ends SUCCESSFUL with
    three attempts; the backend's policy (two runs) fails another task after its second
    run. Before: ``task_retry`` was refused as an unknown option."""
    env = _env(
        str(tmp_path / "app.db"),
        f"sqlite:///{tmp_path / 'quick.db'}",
        tmp_path,
        retry=BACKEND_RETRY,
        task_retry={"shop.tasks.flaky": FLAKY_RETRY},
    )
    found = _django(
        env,
        """
        from shop.tasks import flaky
        out["flaky"] = flaky.enqueue(customer="ann").id
        out["refund"] = refund.enqueue(4, customer="bob").id
        """,
    )
    worker = worker_of(env, "--workers", "1")
    results = _wait_finished(env, [found["flaky"], found["refund"]], worker)
    flaky, refund = results[found["flaky"]], results[found["refund"]]

    assert (flaky["status"], flaky["return"], flaky["attempts"]) == ("SUCCESSFUL", 3, 3)
    runs = _runs(tmp_path, "flaky")
    assert [run[1] for run in runs] == ["1", "2", "3"]  # context.attempt of each run
    starts = [float(run[2]) for run in runs]
    # The backoff is a lower bound: a retry never starts before it (0.5 s, then 1 s).
    assert starts[1] - starts[0] >= 0.5 and starts[2] - starts[1] >= 1.0, starts

    # Result times: set, and in order; started_at the first run's start,
    # last_attempted_at the run that finished (the third).
    enqueued_at, started_at, last_attempted_at, finished_at = flaky["times"]
    assert None not in flaky["times"]
    assert enqueued_at <= started_at < last_attempted_at <= finished_at
    assert started_at <= starts[0] and starts[1] < last_attempted_at <= starts[2], starts

    assert (refund["status"], refund["attempts"]) == ("FAILED", 2)
    assert refund["errors"] == ["builtins.ValueError"] * 2  # one per run
    assert "(attempt 1)" in refund["traceback"] and "(attempt 2)" in refund["traceback"]


def _read(env: dict[str, str], rid: str) -> dict[str, Any]:
    found: dict[str, Any] = _django(env, f"RID = {rid!r}\n" + _READ_ONE)
    return found


def _worker_id(proc: subprocess.Popen[Any]) -> str:
    return f"{socket.gethostname()}:{proc.pid}"


def test_a_task_retried_then_successful_reports_every_attempt(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """A task that fails twice, then succeeds: read through ``get_result`` from another
    process, its result lists both failed runs' errors (their class and traceback, in
    order), three attempts and the worker of each, ``started_at`` its first run's start
    and ``last_attempted_at`` its last. Before: the last run's alone (no errors, the
    workers a constant, both times the third run's)."""
    retry = {**FLAKY_RETRY, "backoff_base_s": 0.05}
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path,
               task_retry={"shop.tasks.flaky": retry})  # fmt: skip
    rid = _django(env, 'from shop.tasks import flaky\nout["id"] = flaky.enqueue(customer="ann").id')
    worker = worker_of(env, "--workers", "1")
    _wait_finished(env, [rid["id"]], worker)
    got = _read(env, rid["id"])

    assert (got["status"], got["attempts"]) == ("SUCCESSFUL", 3), got
    assert [path for path, _ in got["errors"]] == ["builtins.ConnectionError"] * 2
    for run, (_, trace) in enumerate(got["errors"], start=1):
        assert trace.startswith("Traceback (most recent call last):"), trace
        assert f"ConnectionError: run {run}: the mail server is down" in trace, trace
        assert "quick: this run started" not in trace  # the handler's note is left out
    assert got["worker_ids"] == [_worker_id(worker)] * 3
    starts = [float(run[2]) for run in _runs(tmp_path, "flaky")]
    enqueued_at, started_at, last_attempted_at, finished_at = got["times"]
    assert enqueued_at <= started_at <= starts[0] < starts[1] < last_attempted_at <= starts[2]
    assert last_attempted_at <= finished_at


def test_a_dead_lettered_task_reports_each_failed_attempt(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """A task failing every run, dead-lettered after its three: three errors, one per
    run and in order (each its own traceback), three attempts and workers."""
    retry = {"max_attempts": 3, "backoff_base_s": 0.05, "jitter": False}
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path,
               task_retry={"shop.tasks.refund": retry})  # fmt: skip
    rid = _django(env, 'out["id"] = refund.enqueue(4, customer="bob").id')["id"]
    worker = worker_of(env, "--workers", "1")
    _wait_finished(env, [rid], worker)
    got = _read(env, rid)

    assert (got["status"], got["attempts"]) == ("FAILED", 3), got
    assert [path for path, _ in got["errors"]] == ["builtins.ValueError"] * 3
    for run, (_, trace) in enumerate(got["errors"], start=1):
        assert f"ValueError: order 4 was never paid (attempt {run})" in trace, trace
    assert got["worker_ids"] == [_worker_id(worker)] * 3
    enqueued_at, started_at, last_attempted_at, finished_at = got["times"]
    assert enqueued_at <= started_at < last_attempted_at <= finished_at


def test_a_task_retried_many_times_keeps_its_first_and_newest_errors(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """Twelve failed runs: the result keeps the first run's error and the four newest
    (what the stored item holds stays bounded however often a task is retried), while
    ``attempts`` and ``worker_ids`` still count every run."""
    retry = {"max_attempts": 12, "backoff_base_s": 0.01, "backoff_cap_s": 0.02, "jitter": False}
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path,
               task_retry={"shop.tasks.refund": retry})  # fmt: skip
    rid = _django(env, 'out["id"] = refund.enqueue(5, customer="bob").id')["id"]
    worker = worker_of(env, "--workers", "1")
    _wait_finished(env, [rid], worker)
    got = _read(env, rid)

    assert (got["status"], got["attempts"], len(got["worker_ids"])) == ("FAILED", 12, 12), got
    assert len(got["errors"]) == KEPT_ERRORS
    runs = [int(trace.rsplit("(attempt ", 1)[1].split(")")[0]) for _, trace in got["errors"]]
    assert runs == [1, 9, 10, 11, 12]


def test_a_running_task_shows_its_start_and_worker_to_another_process(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """While a task runs, ``get_result`` in another process says RUNNING with its start
    and its worker (from the consumers' heartbeats, within a beat). Before: no start and
    a constant for a worker."""
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    rid = _django(env, 'from shop.tasks import slow\nout["id"] = slow.enqueue(customer="ann").id')
    worker = worker_of(env, "--workers", "1")
    deadline = time.monotonic() + 60
    got = _read(env, rid["id"])
    while got["times"][1] is None and time.monotonic() < deadline and worker.poll() is None:
        time.sleep(0.3)
        got = _read(env, rid["id"])
    (tmp_path / "go").touch()
    assert got["status"] == "RUNNING", got
    started = float(_runs(tmp_path, "slow")[0][1])
    enqueued_at, started_at, last_attempted_at, finished_at = got["times"]
    assert enqueued_at <= started_at == last_attempted_at <= started and finished_at is None
    assert (got["attempts"], got["worker_ids"], got["errors"]) == (1, [_worker_id(worker)], [])
    done = _wait_finished(env, [rid["id"]], worker)[rid["id"]]
    assert done["status"] == "SUCCESSFUL"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"retry": {"backoff_s": 1}}, "'backoff_s'"),  # quick's names: backoff_base_s
        ({"retry": {"max_attempts": 0}}, "max_attempts"),
        ({"retry": {"backoff_base_s": -1}}, "backoff_base_s"),
        ({"retry": ["max_attempts", 3]}, "'retry'"),
        ({"task_retry": {"shop.tasks.flaky": {"max_tries": 3}}}, "shop.tasks.flaky"),
        ({"task_retry": {"shop.tasks.flaky": 3}}, "shop.tasks.flaky"),
        ({"task_retry": ["shop.tasks.flaky"]}, "'task_retry'"),
    ],
)
def test_bad_retry_options_are_refused_by_name(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path, **options)
    found = _django(
        env,
        """
        try:
            from shop.tasks import send_receipt
            send_receipt.enqueue(1, customer="ann")
        except Exception as err:
            out["err"] = [type(err).__name__, str(err)]
        """,
        prelude="import json, sys\nimport django\ndjango.setup()\nout = {}\n",
    )
    assert found.get("err", [""])[0] == "ImproperlyConfigured", found
    assert says in found["err"][1], found


def test_task_retry_naming_no_task_stops_the_worker(tmp_path: Path) -> None:
    """A typo in ``task_retry`` would silently leave a task on the backend's policy: the
    worker refuses to start, naming it."""
    env = _env(
        str(tmp_path / "app.db"),
        f"sqlite:///{tmp_path / 'quick.db'}",
        tmp_path,
        task_retry={"shop.tasks.flakey": FLAKY_RETRY},
    )
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module",
           "quickzones.adapters.django.worker_app"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "shop.tasks.flakey" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_priority_higher_runs_first_and_its_range_is_checked(
    tmp_path: Path,
    worker_of: Any,  # noqa: F811
) -> None:
    """Django's priority (higher first) becomes quick's (lower first): of two tasks of
    one tenant enqueued low then high, the high one runs first. A priority outside
    Django's range is refused, saying the range."""
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    found = _django(
        env,
        """
        out["low"] = send_receipt.using(priority=-5).enqueue(1, customer="ann").id
        out["high"] = send_receipt.using(priority=50).enqueue(2, customer="ann").id
        for bad in (101, -101):
            try:
                send_receipt.using(priority=bad).enqueue(3, customer="ann")
            except Exception as err:
                out.setdefault("refused", []).append([type(err).__name__, str(err)])
        """,
    )
    assert len(found["refused"]) == 2, found
    assert {name for name, _ in found["refused"]} <= {"InvalidTask", "InvalidTaskError"}
    assert all("priority" in text and "100" in text for _, text in found["refused"])
    worker = worker_of(env, "--workers", "1")
    results = _wait_finished(env, [found["low"], found["high"]], worker)
    assert {r["status"] for r in results.values()} == {"SUCCESSFUL"}
    assert (tmp_path / "runs.log").read_text().splitlines() == ["ann 2", "ann 1"]


def _manage(env: dict[str, str], *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True,
        text=True, timeout=60, **kw,
    )  # fmt: skip


def test_manage_py_quick_worker_runs_the_tasks_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``python manage.py quick_worker`` (the app ``quickzones.adapters.django`` in
    INSTALLED_APPS) is ``quick worker`` on the project's tasks: quick worker's options
    pass through (``--processes 2 --workers 1``), an enqueued task runs, SIGTERM stops it
    cleanly. Before: Django knew no such command."""
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    helped = _manage(env, "quick_worker", "--help")
    assert helped.returncode == 0, helped.stderr
    for option in ("--workers", "--processes", "--apps", "--types", "--shutdown-deadline"):
        assert option in helped.stdout.split("Options:")[1], helped.stdout
    options = helped.stdout.split("Options:")[1]
    assert "--app-module" not in options  # the command names it: worker_app

    refused = _manage(env, "quick_worker", "--workers", "0")
    assert refused.returncode != 0 and "--workers" in refused.stderr
    assert "Traceback" not in refused.stderr

    found = _django(env, 'out["id"] = send_receipt.enqueue(7, customer="ann").id')
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "quick_worker", "--processes", "2", "--workers", "1"],
        cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        results = _wait_finished(env, [found["id"]], worker)
        assert worker.poll() is None, worker.communicate()
        assert results[found["id"]]["status"] == "SUCCESSFUL"
        assert results[found["id"]]["return"] == {"order": 7, "sent_to": "ann"}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            out, err = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, err = worker.communicate(timeout=10)
    assert worker.returncode == 0, err
    assert "Traceback" not in err, err
    assert (tmp_path / "runs.log").read_text().splitlines() == ["ann 7"]
    # And it is quick worker's own: the running job types and apps it reports.
    assert "shop.tasks.send_receipt" in out, out

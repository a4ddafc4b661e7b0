"""Django's tasks framework, completed (issue 45 point 5), from a Django user's side, on the
tiny project of tests/django_project: retries with backoff (per backend, and per task
through the backend's ``task_retry`` option), a retried task's result (its status, its
attempts, its times in order), Django's priority run in quick's order, and ``python
manage.py quick_worker`` running the project's tasks until SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
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

    # Result times: set, and in order; the start is the run that finished (the third).
    enqueued_at, started_at, last_attempted_at, finished_at = flaky["times"]
    assert None not in flaky["times"]
    assert enqueued_at <= started_at == last_attempted_at <= finished_at
    assert starts[1] < started_at <= starts[2], (flaky["times"], starts)

    assert (refund["status"], refund["attempts"]) == ("FAILED", 2)
    assert refund["errors"] == ["builtins.ValueError"]
    assert "(attempt 2)" in refund["traceback"]


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

"""The ``quick`` commands as the docs use them (issue 12 points 2, 4 and 17): ``--store``
before or after the subcommand, tables with headers and ``--json``, dead-letter filters,
requeue conflicts, and the worker's options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.errors import PermanentError
from quickzones.registry import JobContext, RetryPolicy
from quickzones.store.records import ZoneId

QUICK = Path(sys.executable).with_name("quick")


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def enqueue(store: str, app: str, tenant: str, *extra: str) -> str:
    code, out, err = invoke(
        "--store", store, "enqueue", "--app", app, "--tenant", tenant, "--job-type", "j", *extra
    )
    assert code == 0, err
    return out.strip()


def by_app(store: str, *before: str) -> dict[str, int]:
    code, out, err = invoke(*before, "stats", "--json")
    assert code == 0, err
    result: dict[str, int] = json.loads(out)["by_app"]
    return result


def test_store_before_or_after_the_subcommand(store: str, tmp_path: Path) -> None:
    enqueue(store, "before", "t")
    code, out, err = invoke(
        "enqueue", "--store", store, "--app", "after", "--tenant", "t", "--job-type", "j"
    )
    assert code == 0, err
    assert by_app(store, "--store", store) == {"before": 1, "after": 1}
    # $QUICK_STORE stands for the group's --store; a subcommand's --store wins over both.
    assert (
        invoke("stats", "--json", env={"QUICK_STORE": store})[1]
        == invoke("--store", store, "stats", "--json")[1]
    )
    other = f"sqlite:///{tmp_path / 'other.db'}"
    Quick.open(other).close()  # read-only commands refuse a store that does not exist
    code, out, _ = invoke("--store", store, "stats", "--store", other, "--json")
    assert json.loads(out)["by_app"] == {}


def _dead(store: str, zones: list[tuple[str, str]]) -> None:
    q = Quick.open(store)
    try:

        @q.job("j", retry=RetryPolicy(max_attempts=1))
        def j(payload: object, ctx: JobContext) -> None:
            raise PermanentError("nope")

        for app, tenant in zones:
            q.enqueue("j", {"z": [app, tenant]}, app=app, tenant=tenant, item_id="x")
        q.run_until_idle()
    finally:
        q.close()


def letters(store: str, *filters: str) -> list[dict[str, object]]:
    code, out, err = invoke("--store", store, "dead-letters", "list", "--json", *filters)
    assert code == 0, err
    docs: list[dict[str, object]] = json.loads(out)
    return docs


ZONES = [("a", "t1"), ("a", "t2"), ("b", "t1"), ("b", "t3")]


@pytest.mark.parametrize(
    "filters",
    [[], ["--app", "a"], ["--tenant", "t1"], ["--app", "a", "--tenant", "t1"], ["--tenant", "t9"]],
    ids=["none", "app", "tenant", "zone", "no-match"],
)
def test_purge_deletes_exactly_what_list_shows(store: str, filters: list[str]) -> None:
    _dead(store, ZONES)
    shown = {(d["app"], d["tenant"]) for d in letters(store, *filters)}
    want = {z for z in ZONES if all(v in z for v in filters[1::2])}
    assert shown == want
    sure = [] if filters else ["--yes"]  # without a filter purge asks first
    code, out, _ = invoke("--store", store, "dead-letters", "purge", *filters, *sure)
    assert code == 0 and out.strip() == f"purged {len(want)}"
    assert {(d["app"], d["tenant"]) for d in letters(store)} == set(ZONES) - want


def test_dead_letters_list_shows_times_attempts_errors_and_traceback(store: str) -> None:
    q = Quick.open(store)
    try:

        @q.job("j", retry=RetryPolicy(max_attempts=2, backoff_base_s=0.0, jitter=False))
        def j(payload: object, ctx: JobContext) -> None:
            raise RuntimeError("boom")

        q.enqueue("j", {"n": 1}, app="a", tenant="t", item_id="x")
        for _ in range(20):
            q.run_until_idle()
            if q.dead_letters():
                break
            time.sleep(0.05)
        q.enqueue("j", {"n": 2}, app="a", tenant="t", item_id="y")
        zone = ZoneId("a", "t")
        (item,) = q.zones.dequeue(zone, 1, 30_000)[0]
        # its run was counted when it was leased: attempt 1
        q.zones.dead_letter(zone, "y", item.lease_id, "ValueError: bad", traceback="TB-LINE\n")
    finally:
        q.close()
    docs = {d["item_id"]: d for d in letters(store)}
    x, y = docs["x"], docs["y"]
    assert x["attempts"] == 2 and x["error_count"] == 2 and x["job_type"] == "j"
    assert "boom" in str(x["reason"]) and isinstance(x["dead_at_ms"], int)
    assert str(x["dead_at"]).endswith("Z") and "RuntimeError: boom" in str(x["traceback"])
    assert y["traceback"] == "TB-LINE\n" and y["attempts"] == 1 and y["error_count"] == 1
    code, out, _ = invoke("--store", store, "dead-letters", "list")
    assert code == 0
    for header in ("item id", "job type", "attempts", "errors", "dead at", "reason"):
        assert header in out
    assert "x" in out and "boom" in out and "TB-LINE" in out


def test_zones_table_has_headers(store: str) -> None:
    enqueue(store, "a", "t")
    code, out, _ = invoke("--store", store, "zones")
    assert code == 0
    for header in ("app", "tenant", "items", "state", "next visit"):
        assert header in out


def test_requeue_of_an_already_queued_id_keeps_the_dead_letter(store: str) -> None:
    _dead(store, [("a", "t")])
    enqueue(store, "a", "t", "--id", "x")
    for extra in (["--id", "x"], []):
        code, _, err = invoke(
            "--store", store, "dead-letters", "requeue", "--app", "a", "--tenant", "t", *extra
        )
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "already queued" in err
        assert [d["item_id"] for d in letters(store)] == ["x"]
    assert by_app(store, "--store", store) == {"a": 1}


def test_worker_takes_lease_deadline_dequeue_max_and_metrics_address(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    done = tmp_path / "done"
    db = tmp_path / "w.db"
    (tmp_path / "handlers.py").write_text(
        "from pathlib import Path\n"
        "from quickzones import Quick\n"
        f"quick = Quick.open('sqlite:///{db}')\n"
        "@quick.job('j')\n"
        "def j(payload, ctx):\n"
        f"    Path({str(done)!r}).write_text('ran')\n"
    )
    env = {**os.environ}
    env.pop("QUICK_STORE", None)
    proc = subprocess.Popen(
        [
            str(QUICK),
            "worker",
            "--app-module",
            "handlers",
            "--lease",
            "7.5",
            "--shutdown-deadline",
            "3",
            "--dequeue-max",
            "4",
            "--metrics-port",
            "0",
            "--metrics-address",
            "127.0.0.1",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "lease 7.5s" in first and "dequeue_max 4" in first
        assert "shutdown deadline 3.0s" in first
        code, _, err = invoke(
            "--store",
            f"sqlite:///{db}",
            "enqueue",
            "--app",
            "a",
            "--tenant",
            "t",
            "--job-type",
            "j",
        )
        assert code == 0, err
        end = time.monotonic() + 60
        while not done.exists() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.05)
        assert done.exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


# --- the group's --store is honoured or refused, never ignored (issue 13 small fixes) ----


MOVE = "move-tenant --from memory://a --to memory://b --app a --tenant t"
MIGRATE = "migrate --from cassandra://127.0.0.1:1/ks --to memory://b"
REPAIR = "cassandra repair --items cassandra://127.0.0.1:1/ks --pointer-store memory://p"


@pytest.mark.parametrize(
    ("command", "takes"),
    [
        ("worker --app-module no_such_app_module", "--app-module"),
        ("periodic list --app-module no_such_app_module", "--app-module"),
        (MOVE, "--from and --to"),
        (MIGRATE, "quick migrate --help"),
        (REPAIR, "quick cassandra repair --help"),
    ],
)
def test_a_command_that_does_not_use_the_group_store_refuses_it(
    tmp_path: Path, command: str, takes: str
) -> None:
    store = f"sqlite:///{tmp_path / 'named.db'}"
    code, _, err = invoke("--store", store, *command.split())
    assert code == 2
    assert "--store" in err and store in err and takes in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "named.db").exists()  # nothing was opened or created


def test_the_group_store_from_the_environment_is_ambient_not_refused(tmp_path: Path) -> None:
    # $QUICK_STORE is set for the commands that use a store; a command that does not just
    # does not use it (here: fails on its own missing module, not on the store).
    code, _, err = invoke(
        "worker", "--app-module", "no_such_app_module",
        env={"QUICK_STORE": f"sqlite:///{tmp_path / 'env.db'}"},
    )  # fmt: skip
    assert code == 2 and "no_such_app_module" in err and "--store" not in err


def test_help_still_works_after_a_group_store(store: str) -> None:
    code, out, _ = invoke("--store", store, "worker", "--help")
    assert code == 0 and "--app-module" in out


def test_demo_runs_on_the_group_store_and_takes_seconds(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'demo.db'}"
    code, out, err = invoke(
        "--store", store, "demo", "--seconds", "0.5", "--tenants", "2", "--rate", "2",
        "--noisy-factor", "2", "--workers", "1", "--work-ms", "0",
    )  # fmt: skip
    assert code == 0, err
    # stats opens read-only: it refuses a store that does not exist, so the demo made it.
    code, out, _ = invoke("stats", "--store", store, "--json")
    assert code == 0 and json.loads(out)["vested"] == 0  # the demo's store, drained


def test_demo_writes_every_pickup_where_asked(tmp_path: Path) -> None:
    """One run's p99 is its twentieth slowest small pickup: too few to compare two trees
    on a noisy host (issue 40 point 9). ``--pickups`` writes every item's pickup, so runs
    can be pooled (``bench.demo``)."""
    path = tmp_path / "pickups.json"
    code, out, err = invoke(
        "demo", "--seconds", "0.5", "--tenants", "2", "--rate", "20", "--noisy-factor", "2",
        "--workers", "2", "--work-ms", "0", "--pickups", str(path),
    )  # fmt: skip
    assert code == 0, err
    written = json.loads(path.read_text())
    run = int(out.split(" items run in ")[0].rsplit("/", 1)[-1])
    assert len(written["small"]) + len(written["noisy"]) == run
    assert written["small"] and all(isinstance(ms, float) and ms >= 0 for ms in written["small"])
    code, _, err = invoke("demo", "--seconds", "0.1", "--pickups", str(tmp_path))
    assert code == 2 and "--pickups" in err  # a directory, refused before the run


def test_demo_seconds_and_duration_are_one_option() -> None:
    code, _, err = invoke("demo", "--seconds", "1", "--duration", "2")
    assert code == 2 and "--seconds" in err and "--duration" in err

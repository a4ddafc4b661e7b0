"""The ``quick`` CLI end to end: every bad input is one clear line and a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_enqueue_stats_zones_and_dead_letters(store: str) -> None:
    code, out, _ = invoke(
        "enqueue",
        "--store",
        store,
        "--app",
        "a",
        "--tenant",
        "t",
        "--job-type",
        "job",
        "--payload",
        '{"x": 1}',
    )
    assert code == 0 and len(out.strip()) > 0
    item_id = out.strip()
    code, out, _ = invoke("stats", "--store", store, "--json")
    stats = json.loads(out)
    assert stats["by_tenant"] == {"a/t": 1} and stats["by_job_type"] == {"job": 1}
    assert stats["active_zones"] == 1
    # Issue 12.17: `zones` prints a table by default; machines read --json.
    code, out, _ = invoke("zones", "--store", store, "--json")
    assert [(z["app"], z["tenant"], z["items"]) for z in json.loads(out)] == [("a", "t", 1)]

    q = Quick.open(store)
    from quickzones.errors import PermanentError

    @q.job("job")
    def job(payload: object, ctx: object) -> None:
        raise PermanentError("nope")

    q.run_until_idle()
    q.close()
    code, out, _ = invoke("dead-letters", "list", "--store", store)
    assert code == 0 and item_id in out and "nope" in out
    code, out, _ = invoke(
        "dead-letters", "requeue", "--store", store, "--app", "a", "--tenant", "t"
    )
    assert code == 0 and "requeued 1" in out
    code, out, _ = invoke("stats", "--store", store, "--json")
    assert json.loads(out)["dead_letters"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "", "--tenant", "t", "--job-type", "job"], "invalid app"),
        (["--app", "a", "--tenant", "t", "--job-type", "bad type"], "invalid job_type"),
        (["--app", "a", "--tenant", "t", "--job-type", "j", "--delay", "-5"], "invalid delay"),
        (["--app", "a", "--tenant", "t", "--job-type", "j", "--payload", "{nope"], "not JSON"),
        (["--app", "a", "--tenant", "t", "--job-type", "j", "--priority", "99999999"], "priority"),
    ],
)
def test_bad_enqueue_is_one_clear_line(store: str, args: list[str], message: str) -> None:
    invoke("enqueue", "--store", store, "--app", "a", "--tenant", "t", "--job-type", "keep")
    code, _, err = invoke("enqueue", "--store", store, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    _, out, _ = invoke("stats", "--store", store, "--json")
    assert json.loads(out)["by_tenant"] == {"a/t": 1}  # nothing stored was lost


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuch://x", "unknown scheme"),
        ("not a url", "missing scheme"),
        ("", "non-empty"),
    ],
)
def test_bad_store_url(url: str, message: str) -> None:
    code, _, err = invoke("stats", "--store", url)
    assert code == 2 and message in err and err.count("\n") == 1


def test_handler_import_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_handlers.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("worker", "--app-module", "broken_handlers")
    assert code == 2 and "cannot import handler module 'broken_handlers'" in err


def test_demo_runs_and_exits_zero(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run(
        [sys.executable, "-m", "quickzones", "demo", "--duration", "3", "--tenants", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tenant-04" in proc.stdout and "noisy" in proc.stdout

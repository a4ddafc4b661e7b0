"""Opening an SQLite store (issue 12 points 11 and 12): many processes open one file at
once without failing; commands that only read never create a store or touch a file that
is not one."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.errors import NotAQuickStore, StoreNotFound

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes and locks")

REPO = Path(__file__).resolve().parents[2]

READ_ONLY_COMMANDS = (["stats"], ["stats", "--json"], ["zones"], ["dead-letters", "list"])


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> list[str]:
    """The SQLite side files (-wal, -shm, -journal) next to ``path``."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "-"))


@pytest.fixture
def foreign_db(tmp_path: Path) -> Path:
    """Another application's SQLite file: rollback journal, its own tables."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada'), ('grace')")
    conn.commit()
    conn.close()
    return path


# --- point 12: read-only commands ------------------------------------------------------


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_refuse_a_missing_store_and_create_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "typo.db"
    code, out, err = invoke(*command, "--store", f"sqlite:///{typo}")
    assert code == 2, out
    assert "does not exist" in err and str(typo) in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_refuse_a_foreign_database_and_leave_it_untouched(
    foreign_db: Path, command: list[str]
) -> None:
    before = digest(foreign_db)
    code, out, err = invoke(*command, "--store", f"sqlite:///{foreign_db}")
    assert code == 2, out
    assert "is not a quick store" in err and "untouched" in err
    assert digest(foreign_db) == before
    assert siblings(foreign_db) == []  # no -wal: it was not switched to WAL
    conn = sqlite3.connect(foreign_db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"users"}
    conn.close()


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database, just notes\n" * 100)
    before = digest(path)
    code, _, err = invoke("stats", "--store", f"sqlite:///{path}")
    assert code == 2 and "not an SQLite database" in err
    assert digest(path) == before and siblings(path) == []


def test_read_only_commands_work_on_a_quick_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(url)
    q.enqueue("job", {"x": 1}, app="a", tenant="t")
    q.close()
    code, out, err = invoke("stats", "--json", "--store", url)
    assert code == 0, err
    assert '"by_app": {"a": 1}' in out


def test_quick_open_create_false(tmp_path: Path, foreign_db: Path) -> None:
    with pytest.raises(StoreNotFound):
        Quick.open(f"sqlite:///{tmp_path / 'missing.db'}", create=False)
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(NotAQuickStore) as info:
        Quick.open(f"sqlite:///{foreign_db}", create=False)
    assert "kv" in info.value.reason
    url = f"sqlite:///{tmp_path / 'q.db'}"
    Quick.open(url).close()
    Quick.open(url, create=False).close()
    # Stores without files just open.
    Quick.open("memory://", create=False).close()


# --- point 11: many processes open one file at once ---------------------------------------

# Waits for a common start time, opens the store and enqueues one item; prints the
# outcome instead of a traceback so the test can count failures.
OPENER = textwrap.dedent(
    """
    import sys, time
    from quickzones.client import Quick

    url, start, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    while time.time() < start:
        time.sleep(0.0005)
    try:
        q = Quick.open(url)
        q.enqueue("job", b"", app="a", tenant=name)
        q.close()
    except Exception as err:
        print(f"FAILED {type(err).__name__}: {err}", flush=True)
        sys.exit(1)
    print("ok", flush=True)
    """
)


def open_together(url: str, processes: int) -> list[str]:
    """Start ``processes`` openers that all open ``url`` at the same instant."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.time() + 3.0  # every interpreter is up by then, even on a busy machine
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, url, str(start), f"t{n}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(processes)
    ]
    outcomes = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        outcomes.append(out.strip() if proc.returncode == 0 else f"exit {proc.returncode}: {out}")
    return outcomes


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'race.db'}"


def test_sixteen_processes_open_a_fresh_file_together(url: str) -> None:
    outcomes = open_together(url, 16)
    failed = [o for o in outcomes if o != "ok"]
    assert failed == [], f"{len(failed)} failed out of {len(outcomes)}: {failed[:3]}"
    q = Quick.open(url, create=False)
    assert sum(q.zones.count(q.zone("a", f"t{n}")) for n in range(16)) == 16
    q.close()


def test_sixteen_processes_open_an_existing_store_together(url: str) -> None:
    Quick.open(url).close()
    outcomes = open_together(url, 16)
    failed = [o for o in outcomes if o != "ok"]
    assert failed == [], f"{len(failed)} failed out of {len(outcomes)}: {failed[:3]}"


HOLD_WRITE_LOCK = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(600)
    """
)


def test_opening_an_existing_store_takes_no_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "held.db"
    # An existing store: opened once by quick, which stores its cluster's layout (the
    # first open of a fresh store writes it; issue 40 point 6). Opening it again reads.
    Quick.open(f"sqlite:///{path}").close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        # Another process holds the write lock for as long as it likes; opening (and
        # reading) must not need it.
        q = Quick.open(f"sqlite:///{path}?busy_timeout_ms=200")
        assert q.dead_letters() == []
        q.close()
    finally:
        holder.kill()
        holder.wait(timeout=10)

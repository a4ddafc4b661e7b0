"""SQLiteStore shared by several OS processes: no lost or doubled updates, crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quickzones.backends.sqlite import SQLiteStore
from quickzones.errors import InvalidStoreURL
from quickzones.store.kv import KVTransaction, pack_i64, run, unpack_i64

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")

REPO = Path(__file__).resolve().parents[2]

# Each increment is a read-modify-write of one counter plus a marker key unique to the
# increment, committed together: counter == number of markers iff nothing was lost or
# applied twice.
INCREMENTER = textwrap.dedent(
    """
    import sys
    from quickzones.store.kv import pack_i64, run, unpack_i64
    from quickzones.urls import open_kv

    path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_kv("sqlite:///" + path)  # an absolute path gives sqlite:////abs/path.db

    def increment(i):
        def fn(tr):
            tr.set(b"counter", pack_i64(unpack_i64(tr.get(b"counter")) + 1))
            tr.set(b"marker/%s/%06d" % (name.encode(), i), b"")
        return fn

    print("started", flush=True)
    for i in range(count):
        run(store, increment(i))
    print("done", flush=True)
    """
)

# Commits one transaction, then stalls inside the next commit after its writes reached
# the WAL but before COMMIT, holding SQLite's write lock, and waits to be killed.
STALLED_COMMITTER = textwrap.dedent(
    """
    import sys, time
    import quickzones.backends.sqlite.resolver as sqlite_resolver
    from quickzones.backends.sqlite import SQLiteStore
    from quickzones.store.kv import pack_i64, run

    store = SQLiteStore(sys.argv[1])
    run(store, lambda tr: tr.add(b"counter", pack_i64(1)))

    real_encode = sqlite_resolver.encode_ranges
    def stall(ranges):
        print("in-commit", flush=True)
        time.sleep(60)
        return real_encode(ranges)
    sqlite_resolver.encode_ranges = stall

    def vandalise(tr):
        tr.clear_range(b"", b"\\xff")
        for i in range(500):
            tr.set(b"junk/%04d" % i, b"x" * 100)
        tr.add(b"counter", pack_i64(1000))
    run(store, vandalise)
    """
)


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen[str], expected: str, timeout: float = 30.0) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == expected:
            return
        if not line and proc.poll() is not None:
            break
    stderr = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"child never printed {expected!r}: {stderr}")


def counter_and_markers(store: SQLiteStore) -> tuple[int, int]:
    def read(tr: KVTransaction) -> tuple[int, int]:
        markers = tr.get_range(b"marker/", b"marker0", snapshot=True)
        return unpack_i64(tr.get(b"counter")), len(markers)

    return run(store, read)


def test_processes_incrementing_one_counter_never_lose_or_double_updates(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    SQLiteStore(path).close()  # create the schema once, before the race
    procs = [spawn(INCREMENTER, path, f"p{n}", "60") for n in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "done" in out
    store = SQLiteStore(path)
    assert counter_and_markers(store) == (240, 240)
    store.close()


def test_sigkill_mid_commit_leaves_the_store_consistent(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    SQLiteStore(path).close()
    proc = spawn(STALLED_COMMITTER, path)
    try:
        wait_for_line(proc, "in-commit")  # its writes are in the WAL, uncommitted
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    store = SQLiteStore(path, busy_timeout_ms=2000)
    assert store.snapshot_items() == {b"counter": pack_i64(1)}
    version = store.committed_version
    # The dead process's write lock is gone: new writers commit at once.
    run(store, lambda tr: tr.add(b"counter", pack_i64(1)))
    assert store.snapshot_items() == {b"counter": pack_i64(2)}
    assert store.committed_version > version
    store.close()


def test_sigkill_during_an_increment_race_keeps_counter_and_markers_equal(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "race.db")
    SQLiteStore(path).close()
    victim = spawn(INCREMENTER, path, "victim", "100000")
    survivors = [spawn(INCREMENTER, path, f"s{n}", "40") for n in range(2)]
    wait_for_line(victim, "started")
    time.sleep(0.3)  # let it commit some increments and be mid-transaction
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    for proc in survivors:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    store = SQLiteStore(path)
    counter, markers = counter_and_markers(store)
    assert counter == markers
    assert counter >= 80  # the survivors' increments all landed
    store.close()


def test_url_paths_follow_sqlalchemy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = SQLiteStore.from_url("sqlite:///rel.db?busy_timeout_ms=500&synchronous=full")
    assert relative.path == "rel.db" and (tmp_path / "rel.db").exists()
    relative.close()
    absolute = SQLiteStore.from_url(f"sqlite:///{tmp_path / 'abs.db'}")
    assert absolute.path == str(tmp_path / "abs.db")
    absolute.close()
    with pytest.raises(InvalidStoreURL, match="four slashes"):
        SQLiteStore.from_url("sqlite:///no/such/dir/q.db")
    with pytest.raises(InvalidStoreURL, match="unknown option"):
        SQLiteStore.from_url("sqlite:///rel.db?journal=off")

"""A SQLite file deleted or replaced under a running ``quick worker`` (issue 28 point 6):
the worker notices within seconds, says so at ERROR naming the file, and stops with a
non-zero exit, so its supervisor starts it again on the file there now and the items
enqueued into that file run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quickzones.backends.sqlite import SQLiteStore
from quickzones.client import Quick
from quickzones.errors import StoreLost
from quickzones.store.kv import run
from tests.waiting import wait_for

HANDLERS = """\
import os
from quickzones import Quick
quick = Quick.open(os.environ["STORE"])
@quick.job("note")
def note(payload, ctx):
    with open(os.environ["RAN"], "a") as f:
        f.write(f"{payload}\\n")
"""


def _worker(tmp_path: Path, url: str, ran: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "w") as err_file:
        return subprocess.Popen(
            [sys.executable, "-m", "quickzones", "worker", "--app-module", "handlers"],
            cwd=tmp_path,
            env={**os.environ, "STORE": url, "RAN": str(ran)},
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_quick_worker_stops_when_its_sqlite_file_is_deleted_or_replaced(
    tmp_path: Path, how: str
) -> None:
    db = tmp_path / "quick.db"
    url = f"sqlite:///{db}"
    ran = tmp_path / "ran.txt"
    (tmp_path / "handlers.py").write_text(HANDLERS)
    q = Quick.open(url)
    for n in range(5):
        q.enqueue("note", f"old-{n}", app="a", tenant=f"t{n}")
    q.close()
    first = _worker(tmp_path, url, ran, tmp_path / "first.err")
    second: subprocess.Popen[bytes] | None = None
    try:
        assert wait_for(lambda: len(_lines(ran)) == 5), (tmp_path / "first.err").read_text()
        if how == "deleted":  # as `rm quick.db*` does; the next open creates a new store
            for path in tmp_path.glob("quick.db*"):
                path.unlink()
            fresh = Quick.open(url)
        else:  # a store built elsewhere, renamed over the path
            fresh = Quick.open(f"sqlite:///{tmp_path / 'other.db'}")
        for n in range(20):
            fresh.enqueue("note", f"new-{n}", app="a", tenant=f"t{n}")
        if how == "replaced":  # as a restore does: the file, without the old one's WAL
            fresh.close()
            for suffix in ("-wal", "-shm"):
                (tmp_path / f"quick.db{suffix}").unlink(missing_ok=True)
            os.replace(tmp_path / "other.db", db)
        # Before: the worker ran on, silently, on the deleted inode; 0 of the 20 ran.
        assert wait_for(lambda: first.poll() is not None, 60), "the worker did not notice"
        log = (tmp_path / "first.err").read_text()
        assert first.returncode != 0, log
        # A deleted file recreated before the worker looked reads as replaced.
        said = f"{db} was replaced" in log or (how == "deleted" and f"{db} was deleted" in log)
        assert " ERROR " in log and said, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        # Its supervisor starts it again: it opens the file there now and runs its items.
        second = _worker(tmp_path, url, ran, tmp_path / "second.err")
        assert wait_for(lambda: len(_lines(ran)) == 25), (
            _lines(ran),
            sorted(os.listdir(tmp_path)),
            (tmp_path / "second.err").read_text(),
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    assert sorted(_lines(ran)) == sorted(
        [f"old-{n}" for n in range(5)] + [f"new-{n}" for n in range(20)]
    )


def test_a_store_whose_file_was_deleted_refuses_every_transaction(tmp_path: Path) -> None:
    db = tmp_path / "quick.db"
    store = SQLiteStore(db)
    run(store, lambda tr: tr.set(b"k", b"v"))
    db.unlink()

    def refused() -> bool:
        try:
            run(store, lambda tr: tr.get(b"k"))
        except StoreLost as err:
            return f"{db} was deleted" in str(err)
        return False

    assert wait_for(refused, 30)  # checked once a second
    with pytest.raises(StoreLost):  # and from then on, every time
        run(store, lambda tr: tr.get(b"k"))
    store.close()

"""The kernel's signal that a SQLite file was written (backends/sqlite/file_signal.py),
on which an idle worker's commit watcher sleeps (issue 44 point 4): another process's
commit ends the wait, writes to other files of the directory do not."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from quickzones.backends.sqlite.file_signal import open_signal
from quickzones.client import Quick
from quickzones.store.changes import watcher_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux")


def test_a_commit_ends_the_wait_and_other_files_do_not(tmp_path: Path) -> None:
    db = tmp_path / "quick.db"
    signal = open_signal(str(db))
    assert signal is not None
    try:
        assert not signal.wait(0.05)  # nothing written

        def log_lines() -> None:
            for _ in range(10):
                with open(tmp_path / "app.log", "a") as log:
                    log.write("a line\n")
                time.sleep(0.01)

        writer = threading.Thread(target=log_lines)
        writer.start()
        assert not signal.wait(0.3)  # another file of the directory: waits on
        writer.join()
        producer = Quick.open(f"sqlite:///{db}")
        try:
            while signal.wait(0.1):  # the file's creation
                pass
            enqueue = threading.Timer(0.05, producer.enqueue, ("j", 1), {"app": "a", "tenant": "t"})
            enqueue.start()
            began = time.monotonic()
            assert signal.wait(30)
            enqueue.join()
            assert time.monotonic() - began >= 0.04  # the enqueue's, not an earlier write
        finally:
            producer.close()
    finally:
        signal.close()


def test_a_sqlite_stores_watcher_is_signalled(tmp_path: Path) -> None:
    q = Quick.open(f"sqlite:///{tmp_path / 'quick.db'}")
    try:
        watcher = watcher_for(q.toplevel.kv)
        assert watcher is not None
        watcher.version()  # the watching connection, and with it the signal, opened
        assert watcher.signalled
    finally:
        q.close()

"""Helpers shared by the unit tests."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from quickzones.client import Quick
from quickzones.store.kv import KVTransaction


def count_range_rows(q: Quick) -> list[int]:
    """From now on, every range read of ``q``'s store appends the rows it returned to the
    list returned here: what a zone operation read, whatever the backend."""
    reads: list[int] = []
    real = q.kv.create_transaction

    def counting() -> KVTransaction:
        tr = real()
        orig = tr.get_range

        def get_range(*a: object, **k: object) -> list[tuple[bytes, bytes]]:
            rows = orig(*a, **k)  # type: ignore[arg-type]
            reads.append(len(rows))
            return rows

        tr.get_range = get_range  # type: ignore[method-assign]
        return tr

    q.kv.create_transaction = counting  # type: ignore[method-assign]
    return reads


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (as mount takes it: "2m") mounted on the new ``folder``;
    skips the test where mounting is not allowed (it needs root)."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (root only); skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "small", "2m") as mount:
        yield mount


def fill_disk(folder: Path) -> Path:
    """Write a ballast file in ``folder`` until its filesystem is full; returns it."""
    ballast = folder / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                f.write(bytes(4096))
        except OSError:
            pass
    return ballast


_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")


def log_records(text: str) -> list[str]:
    """The first lines of the log records in ``text`` (the CLI's logging format)."""
    return [line for line in text.splitlines() if _RECORD.match(line)]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the process ``pid`` has used so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans (start, end) open at one moment."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def enqueued_at_once(
    enqueue: Callable[[int, int], str], threads: int = 2, each: int = 20
) -> list[str]:
    """The ids ``enqueue(thread, i)`` returned from ``threads`` threads started together,
    ``each`` calls each: racing enqueues of one key (idempotency, debounce)."""
    ids: list[str] = []
    start = threading.Barrier(threads)

    def producer(n: int) -> None:
        start.wait()
        for i in range(each):
            ids.append(enqueue(n, i))

    running = [threading.Thread(target=producer, args=(n,)) for n in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return ids

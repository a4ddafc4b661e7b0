"""Shared helpers: statistics, machine facts, free ports, the per-job record file.

Every job of every system (quick and peers) records its start by appending one line to a
file named by ``BENCH_OUT``. An O_APPEND write of one short line is atomic across threads,
processes and forks, so it works the same for thread pools, prefork pools and RQ's
fork-per-job horse, and costs each system the same few microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment a bench child runs in: the caller's, with the repository on
    PYTHONPATH after whatever that already names (an installed wheel, as the 16-core
    machine's ``.dev/run.sh`` sets it), so both the bench modules and quickzones import."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def compile_bytecode(packages: tuple[str, ...] = ()) -> list[str]:
    """Write the bytecode of quickzones, this bench and ``packages`` (each system's own
    package), as ``pip install`` of a wheel does, so that no system's start-up includes
    compiling its sources: an editable checkout has no ``__pycache__`` until a run writes
    one, and under ``PYTHONDONTWRITEBYTECODE`` (set on these VMs) no run ever does, so
    every ``quick worker`` compiled all of quick (0.15-0.2 s of a 0.3-0.5 s start-up)
    while the peers, installed from wheels, loaded theirs. Returns the folders compiled."""
    import compileall
    import importlib.util

    done: list[str] = []
    # quickzones' backends and adapters live in folders of their own (pyproject.toml's
    # package-dir), so each is named.
    for name in ("quickzones", "quickzones.backends", "quickzones.adapters", "bench", *packages):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)
            done.append(folder)
    return done


def run_folder(name: str, out: str | None = None) -> Path:
    """Where one run writes its files: ``out`` when given, else a new
    ``bench/results/<UTC timestamp>-<name>/``, which ``.gitignore`` leaves untracked (a
    run cited by the docs is added by hand: ``bench/results/README.md``)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = Path(out) if out else ROOT / "results" / (f"{stamp}-{name}" if name else stamp)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_run(name: str, out: str | None, command: str, fields: dict[str, Any]) -> Path:
    """One run's document: its command and machine, then ``fields``, written as
    ``<name>.json`` (``-`` read as ``_``) in :func:`run_folder` ``(name, out)``; returns
    the folder."""
    folder = run_folder(name, out)
    document = {"command": command, "machine": machine(), **fields}
    (folder / f"{name.replace('-', '_')}.json").write_text(json.dumps(document, indent=1))
    return folder


def store_run_parser(doc: str) -> argparse.ArgumentParser:
    """The command line of a timed run over one store (``bench.weights``,
    ``bench.tenant_rate``): ``--seconds``, ``--store`` (read with :func:`store_url`) and
    ``--out`` (:func:`run_folder`); the run adds its own options. ``doc``: the run's module
    docstring, whose first line describes it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--store", default=None, help="a store URL (default: a new SQLite file)")
    ap.add_argument("--out", default=None)
    return ap


def store_url(given: str | None, db_name: str) -> str:
    """``--store`` as given, or a new SQLite file ``db_name`` in a fresh temporary folder."""
    return given or f"sqlite:///{Path(tempfile.mkdtemp()) / db_name}"


def summary(values: list[float]) -> dict[str, float]:
    """Median and spread of repeated runs."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "runs": list(values),
    }


def latency_summary(values_ms: list[float]) -> dict[str, float]:
    # Imported here, not at the top: the peers' job modules import this module for
    # record_start, and their workers must not pay quick's imports at start-up (Huey's
    # drain, timed from its worker's spawn, paid 0.15-0.19 s of them).
    from quickzones.cli.demo import percentile  # the demo's nearest-rank percentile

    return {
        "n": len(values_ms),
        "p50": percentile(values_ms, 50),
        "p99": percentile(values_ms, 99),
        "p999": percentile(values_ms, 99.9),
        "max": max(values_ms) if values_ms else float("nan"),
    }


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    commit = "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "cpu": cpu,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "commit": commit,
    }


# --- the per-job record file -----------------------------------------------------------

# Per environment variable naming a record file: the process that opened it, the path,
# the O_APPEND fd. Reopened after a fork or when a later experiment in this process names
# a new file.
_fds: dict[str, tuple[int, str, int]] = {}


def _append(var: str, line: str) -> None:
    pid, path = os.getpid(), os.environ[var]
    held = _fds.get(var)
    if held is None or held[:2] != (pid, path):
        if held is not None and held[0] == pid:
            os.close(held[2])
        held = _fds[var] = (pid, path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
    os.write(held[2], line.encode())


def record_start(
    tenant: str, enq_ts: float, due_ts: float, work_ms: float = 0.0, item_id: str = ""
) -> None:
    """Called first thing in every benchmark job: one line ``tenant enq due start``, with
    the item's id as a fifth field when given (to count items run twice or never). Where
    the worker's environment names ``BENCH_END_OUT`` (:mod:`bench.peers_users`), the job's
    end is appended there too, ``tenant end``, once its work is done: a drain is timed to
    the last job's end, not its start."""
    start = time.time()
    tail = f" {item_id}" if item_id else ""
    _append("BENCH_OUT", f"{tenant} {enq_ts:.6f} {due_ts:.6f} {start:.6f}{tail}\n")
    if work_ms:
        time.sleep(work_ms / 1000)
    if os.environ.get("BENCH_END_OUT"):
        _append("BENCH_END_OUT", f"{tenant} {time.time():.6f}\n")


@dataclass(slots=True)
class Record:
    tenant: str
    enq: float
    due: float
    start: float
    item: str = ""


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def read_records(path: Path) -> list[Record]:
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) in (4, 5):
            item = parts[4] if len(parts) == 5 else ""
            out.append(Record(parts[0], float(parts[1]), float(parts[2]), float(parts[3]), item))
    return out


def wait_for_lines(path: Path, n: int, timeout_s: float, poll_s: float = 0.01) -> float:
    """Wait until ``path`` holds ``n`` records; returns the time it got there (or NaN)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if count_lines(path) >= n:
            return time.time()
        time.sleep(poll_s)
    return float("nan")


def read_ends(path: Path) -> list[float]:
    """The job ends :func:`record_start` appended to ``BENCH_END_OUT``."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [float(parts[1]) for parts in map(str.split, text.splitlines()) if len(parts) == 2]


def last_start(path: Path) -> float:
    recs = read_records(path)
    return max((r.start for r in recs), default=float("nan"))


def stop_process(proc: subprocess.Popen[Any], wait_s: float = 15.0) -> None:
    """SIGTERM ``proc`` (a worker's graceful stop), SIGKILL it if it is still running
    after ``wait_s``, and reap it."""
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def cpu_seconds(procs: Iterable[Any]) -> float:
    """User and system CPU seconds so far of ``procs`` (``psutil.Process``), those gone
    meanwhile left out."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- FoundationDB -----------------------------------------------------------------------

_fdb_roots = 0


def fdb_available() -> bool:
    """True when a FoundationDB cluster can be had (quickzones.testing.provision: FDB_CLUSTER_FILE,
    an fdbserver from FDB_BIN_DIR or ../shared/fdb or PATH, or Docker)."""
    try:
        from quickzones.testing.provision import fdb_source

        return fdb_source() is not None
    except Exception:  # a broken FDB_BIN_DIR and the like: no fdb:// numbers, say so
        return False


def fdb_url(tag: str) -> str:
    """An ``fdb://`` URL with a fresh key prefix on the bench run's one cluster (a local
    ``fdbserver``, ``single memory``, started on first use and killed at exit)."""
    global _fdb_roots
    from urllib.parse import quote

    from quickzones.testing.provision import shared_fdb_cluster_file

    cluster = shared_fdb_cluster_file()
    _fdb_roots += 1
    root = f"bench-{os.getpid()}-{_fdb_roots}-{tag}/"
    return f"fdb://{quote(str(cluster))}?root={quote(root)}"

"""One tenant alone in the queue (issue 15 point 7, issue 14's fdb:// target).

``python -m bench.lone_tenant [--n 5000] [--runs 3] [--backends sqlite,fdb] [--no-huey]
[--visits three|one|both] [--sizes paper,work_conserving]``

5,000 no-op items of one tenant are stored first, then one worker process with 4 threads
drains them: quick as a user starts it (``quick worker --workers 4`` with every other
setting at its default, :mod:`bench.user_app`; size ``user``, the figure the docs cite),
quick's throughput profile (``python -m bench.quickrun``, ``throughput_config(workers=4,
dequeue_max=10)``) with every visit at ``dequeue_max`` (paper, invariant 7) and with
work-conserving visits (``visit_max``), and Huey on SQLite (``huey_consumer -w 4 -k
thread``). The rate is (n - 1) / (end - first start), from the jobs' own start records
(:func:`bench.common.record_start`), so process start-up counts for nobody; the end is
the last start for Huey and for ``quick worker`` (no-op jobs, results off; the same
measure for both) and, stricter, the moment quick's ``completed`` counter reached n
(completions committed) for the profile. For ``quick worker`` and Huey the worker
process's CPU seconds per 1,000 items over the same span are reported too (Linux).
``--visits``: the consumer's zone visits, the paper's three transactions
(``one_transaction_visits=False``, the default), one, or both side by side; with both, each
run has every system in both modes, the order of the two alternating from run to run.
Results: ``bench/results/<UTC timestamp>-lone/lone_tenant.json``. Compare within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    child_env,
    count_lines,
    fdb_url,
    log,
    machine,
    read_records,
    run_folder,
    summary,
    wait_for_lines,
)
from bench.quickrun import JOB, config_to_json, open_quick, throughput_config
from quickzones.store.kv import KVTransaction

TENANT = "alone"


def _rate(out: Path, n: int) -> float:
    starts = sorted(r.start for r in read_records(out) if r.tenant == TENANT)
    if len(starts) < n:
        return float("nan")
    return (n - 1) / (starts[-1] - starts[0])


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system; Linux's /proc, else NaN)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# CPU seconds per 1,000 items of the last _drain's worker process, from its first job's
# start to its n-th (start-up not counted, as for the rate).
last_cpu: dict[str, float] = {}


def _drain(
    cmd: list[str], env: dict[str, str], out: Path, n: int, logf: Path, timeout_s: float = 120.0
) -> float:
    """The worker ``cmd``'s rate over the n records it writes to ``out``; NaN when they are
    not all there within ``timeout_s``."""
    with open(logf, "ab") as lf:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=lf, stderr=lf)
    last_cpu.clear()
    try:
        wait_for_lines(out, 1, 120, poll_s=0.002)
        cpu0, k0 = _cpu_s(proc.pid), count_lines(out)
        wait_for_lines(out, n, timeout_s, poll_s=0.002)
        k1 = count_lines(out)
        last_cpu["per_1000"] = (_cpu_s(proc.pid) - cpu0) * 1000 / max(1, k1 - k0)
        return _rate(out, n)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# The last quick_rate run's consumer event counts (visits, conflicts, lease failures).
last_events: dict[str, Any] = {}
EVENTS = ("visited", "one_transaction_visit_conflict", "pointer_lease_failed", "completed")


def _store_backlog(url: str, n: int, work: Path, spread: bool = False) -> Path:
    """The lone tenant's ``n`` items, stored before any consumer starts; returns the
    (emptied) file the jobs record their starts in. ``spread``: one item in each of ``n``
    tenants instead (bench.tenant_scale), 1,000 enqueues a transaction; their records
    still say TENANT, so the rate counts them all."""
    out = work / "records.txt"
    out.write_bytes(b"")
    q = open_quick(url)
    t = time.time()
    payload = {"t": TENANT, "e": t, "d": t}
    for i in range(0, n, 1000 if spread else 100):
        if spread:

            def some(tr: KVTransaction, first: int = i) -> None:
                for k in range(first, min(n, first + 1000)):
                    q.enqueue(JOB, payload, app="b", tenant=f"one-{k:07d}", tr=tr)

            q.transact(some)
        else:
            q.enqueue_many(JOB, [payload] * min(100, n - i), app="b", tenant=TENANT)
    q.close()
    return out


def quick_rate(url: str, n: int, work: Path, visit_max: int | None, one: bool = False) -> float:
    out = _store_backlog(url, n, work)
    env = child_env(BENCH_OUT=str(out))
    cfg = throughput_config(
        workers=4, dequeue_max=10, visit_max=visit_max, one_transaction_visits=one
    )
    done = work / "done.json"
    cmd = [sys.executable, "-m", "bench.quickrun", url, "--config", config_to_json(cfg)]
    cmd += ["--seconds", "300", "--expect", str(n), "--done", str(done)]
    with open(work / "quick.log", "ab") as lf:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=lf, stderr=lf, timeout=400)
    if proc.returncode != 0 or not done.exists():
        return float("nan")
    # Counted to the last completion (committed), not the last start.
    d = json.loads(done.read_text())
    done_at = d["done_at"]
    last_events.clear()
    last_events.update({k: d["stats"].get(k, 0) for k in EVENTS})
    last_events["lease_failed_reasons"] = d.get("lease_failed", {})
    last_events["one_tx"] = d.get("one_transaction_visits", {})
    first = min(r.start for r in read_records(out) if r.tenant == TENANT)
    return (n - 1) / (done_at - first)


def user_rate(url: str, n: int, work: Path, workers: int = 4, spread: bool = False) -> float:
    """``quick worker --workers N`` with its defaults, drained like Huey (``spread``: the
    n items one in each of n tenants, :func:`_store_backlog`)."""
    from bench.quickrun import user_worker_cmd as worker_cmd

    out = _store_backlog(url, n, work, spread)
    env = child_env(BENCH_OUT=str(out), QUICK_STORE=url)
    # At least 100 items/s: a 100,000-item drain (bench.tenant_scale) outlasts 120 s.
    timeout_s = max(120.0, n / 100)
    return _drain(worker_cmd(workers), env, out, n, work / "quick-worker.log", timeout_s)


def huey_rate(n: int, work: Path) -> float:
    out = work / "records.txt"
    out.write_bytes(b"")
    db = str(work / "huey.db")
    os.environ["BENCH_OUT"] = str(out)
    os.environ["BENCH_HUEY_DB"] = db
    env = child_env()
    import importlib

    # Reloaded: a fresh SqliteHuey on this run's file (the storage caches its connection).
    tasks: Any = importlib.reload(importlib.import_module("bench.peers.huey_tasks"))
    t = time.time()
    for _ in range(n):
        tasks.job(TENANT, t, t, 0.0)
    # This interpreter runs Huey's consumer (huey_consumer on PATH may be another Python's,
    # one that cannot import the bench's modules: every run then timed out as NaN).
    cmd = [sys.executable, "-m", "huey.bin.huey_consumer", "bench.peers.huey_tasks.huey"]
    cmd += ["-w", "4", "-k", "thread"]
    cmd += ["-d", "0.01", "-m", "0.1", "-b", "1.15", "-q"]
    return _drain(cmd, env, out, n, work / "huey.log")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lone_tenant")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backends", default="sqlite,fdb")
    ap.add_argument("--no-huey", action="store_true")
    ap.add_argument(
        "--visits",
        choices=["three", "one", "both"],
        default="three",
        help="quick's zone visits: the paper's three transactions, one, or both (interleaved)",
    )
    ap.add_argument(
        "--sizes",
        default="user,paper,work_conserving",
        help="user (quick worker --workers 4, defaults), and the throughput profile's visit "
        "sizes paper and work_conserving",
    )
    ap.add_argument("--out", default="", help="results directory")
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    sizes: list[tuple[str, int | None]] = [
        ("user", None),
        ("paper", None),
        ("work_conserving", 1000),
    ]
    sizes = [(label, vm) for label, vm in sizes if label in args.sizes.split(",")]
    visits = ["three", "one"] if args.visits == "both" else [args.visits]
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # CPU s per 1,000 items: quick worker's and Huey's
    events: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-lone-") as tmp:
        for r in range(args.runs):
            systems: list[tuple[str, Any]] = []
            # With both modes, which goes first alternates run by run.
            order = visits if r % 2 == 0 else visits[::-1]
            for b in backends:
                for label, vm in sizes:
                    if label == "user":  # the defaults: no visit mode to choose
                        systems.append((f"quick-{b}-user", (b, "user", False)))
                        continue
                    for v in order:
                        tag = "" if args.visits == "three" else f"-{v}"
                        systems.append((f"quick-{b}-{label}{tag}", (b, vm, v == "one")))
            if not args.no_huey:
                systems.append(("huey-sqlite", None))
            for name, spec in systems:
                work = Path(tmp) / f"{name}-{r}"
                work.mkdir()
                last_cpu.clear()
                if spec is None:
                    rate = huey_rate(args.n, work)
                else:
                    b, vm, one = spec
                    url = fdb_url(f"lone{r}") if b == "fdb" else f"sqlite:///{work}/q.db"
                    last_events.clear()
                    if vm == "user":
                        rate = user_rate(url, args.n, work)
                    else:
                        rate = quick_rate(url, args.n, work, vm, one)
                        events.setdefault(name, []).append(dict(last_events))
                rates.setdefault(name, []).append(rate)
                per_1000 = last_cpu.get("per_1000")  # a drained worker process's
                if per_1000 is not None:
                    cpu.setdefault(name, []).append(per_1000)
                took = "" if per_1000 is None else f", {per_1000:.3f} CPU s per 1,000 items"
                log(f"lone tenant run {r + 1}/{args.runs}: {name} {rate:.0f} items/s{took}")
                if spec is not None:
                    log(f"  events {last_events}")
    res: dict[str, Any] = {
        "n": args.n,
        "runs": args.runs,
        "machine": machine(),
        "command": "python -m bench.lone_tenant " + " ".join(argv or sys.argv[1:]),
        "rates": {k: summary(v) for k, v in rates.items()},
        "cpu_s_per_1000_items": {k: summary(v) for k, v in cpu.items()},
        "events": events,
    }
    huey = res["rates"].get("huey-sqlite", {}).get("median")
    if args.visits == "both":
        res["ratio_one_to_three"] = {
            k[: -len("-one")]: v["median"] / res["rates"][k[: -len("-one")] + "-three"]["median"]
            for k, v in res["rates"].items()
            if k.endswith("-one")
        }
        # Run by run (one and three ran next to each other in each run).
        pairs: dict[str, list[float]] = {}
        for k, v in rates.items():
            if k.endswith("-one"):
                base = k[: -len("-one")]
                pairs[base] = [o / t for o, t in zip(v, rates[base + "-three"], strict=True)]
        res["pair_ratios_one_to_three"] = pairs
    if huey:
        res["ratio_to_huey"] = {
            k: v["median"] / huey for k, v in res["rates"].items() if k != "huey-sqlite"
        }
    out = run_folder("lone", args.out)
    (out / "lone_tenant.json").write_text(json.dumps(res, indent=1))
    for k, v in res["rates"].items():
        log(f"{k}: median {v['median']:.0f} items/s ({v['min']:.0f}-{v['max']:.0f})")
    for k, ratio in res.get("ratio_one_to_three", {}).items():
        log(f"{k}: one/three {ratio:.3f}")
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

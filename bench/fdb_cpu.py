"""The CPU a consumer process spends per item on FoundationDB, and what the server writes
per item (issue 44 point 5).

``python -m bench.fdb_cpu [--items 2000] [--tenants 1,200] [--runs 3] [--baseline PYTHON]
[--py-spy PATH] [--query OPTIONS] [--out DIR]``

Each run fills a fresh key prefix of one local ``fdbserver`` (``single memory``, the
bench's shared cluster) with ``--items`` no-op items, in one tenant or spread evenly over
many, then a child process drains them with the consumer ``quick worker --workers 4``
builds (``ConsumerConfig(workers=4)``, every other field its default, unless
``--consumer '{"field": value}'`` says otherwise), its threads placed as ``quick worker``
places them (``QUICK_CPUS``, default ``auto``: ``quickzones.cpu_placement``). The
child is started and its consumer built before the measured stretch; it then reports

* its process CPU time per 1,000 items (``time.process_time``: every thread of the
  process, libfdb_c's network thread included, and no other process on the host), from
  ``consumer.start()`` to the last item's completion;
* the wall drain rate over the same stretch;

and the parent reads the cluster's own counters (``fdbcli --exec 'status json'``,
``cluster.workload``) before and after the drain: mutations (``operations.writes``),
bytes written, committed and conflicted transactions and reads, each per item. The
cluster refreshes those counters about every 5 s, so each reading waits for a refresh; its
own background work (about 0.5 commits and 0.2 writes a second) stays in the figures,
some 0.005 per item at 2,000 items.

``--baseline`` names another checkout's interpreter (its own virtualenv): each run of
that tree follows or precedes one of this tree (A B B A ...), and its child is this file
run by that interpreter, so it uses only the public API both trees have. The items are
enqueued by this tree (the key layout is the same in both).

``--query`` adds ``fdb://`` URL options to this tree's drains alone (``snapshot_reads=0``: an
option A/B against the baseline tree's defaults).

``--py-spy PATH`` records each of this tree's drains with ``py-spy record --gil -f raw``
and writes the samples summed by function (own samples and with callees) beside the JSON.

Results: ``bench/results/<UTC timestamp>-fdb-cpu/fdb_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

NOOP = "noop"
COUNTERS = {
    "writes": ("operations", "writes"),
    "reads": ("operations", "reads"),
    "bytes_written": ("bytes", "written"),
    "commits": ("transactions", "committed"),
    "conflicts": ("transactions", "conflicted"),
    "started": ("transactions", "started"),
}
# What every drain moves (each item is deleted in a commit).
DRAIN_MOVES = ("writes", "commits")


# --- the child: one consumer process, in whichever tree runs this file ---------------------


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name (libfdb_c's
    network thread is the binding's Python thread that runs ``fdb_run_network``), from
    ``/proc/self/task``; threads of one name are summed, and gone threads are not here."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        name = name.rstrip("0123456789-_ ") or name  # worker-3 and worker-1 together
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def drain_child(url: str, items: int, overrides: dict[str, Any]) -> None:
    """Build the consumer, say ``ready`` and wait for ``go`` on stdin, then drain and print
    the figures as one JSON line."""
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    q = Quick.open(url)
    q.job(NOOP)(lambda payload, ctx: None)
    # quick worker --workers 4, and any --consumer overrides
    consumer = q.consumer(ConsumerConfig(**{"workers": 4, **overrides}))
    try:  # its threads placed as quick worker places them (QUICK_CPUS, default auto)
        from quickzones.cpu_placement import CpuPlacement, parse_cpus
    except ImportError:  # a baseline tree from before CPU placement
        pass
    else:
        CpuPlacement(parse_cpus(os.environ.get("QUICK_CPUS", "auto"))).start()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    sys.stdin.readline()
    threads0 = thread_cpu() if os.path.isdir("/proc/self/task") else {}
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = time.process_time(), time.perf_counter()
    consumer.start()
    while consumer.stats["completed"] < items:
        time.sleep(0.005)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    threads = thread_cpu() if threads0 else {}
    use = resource.getrusage(resource.RUSAGE_SELF)
    done = {
        "items": int(consumer.stats["completed"]),
        "visits": int(consumer.stats["visited"]),
        "cpu_s": cpu,
        "wall_s": wall,
        # Kernel time and context switches: the GIL's hand-offs between threads show here.
        "sys_s": use.ru_stime - use0.ru_stime,
        "switches_per_item": (use.ru_nvcsw - use0.ru_nvcsw + use.ru_nivcsw - use0.ru_nivcsw)
        / max(items, 1),
        "thread_cpu_s": {k: round(v - threads0.get(k, 0.0), 3) for k, v in threads.items()},
    }
    consumer.stop(deadline_s=5)
    q.close()
    print(json.dumps(done), flush=True)


# --- the parent ------------------------------------------------------------------------


def server_counters(fdbcli: str, cluster: Path) -> dict[str, int]:
    out = subprocess.run(
        [fdbcli, "-C", str(cluster), "--exec", "status json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    workload = json.loads(out)["cluster"]["workload"]
    return {name: int(workload[a][b]["counter"]) for name, (a, b) in COUNTERS.items()}


def fresh_counters(
    fdbcli: str,
    cluster: Path,
    timeout_s: float = 30.0,
    *,
    past: dict[str, int] | None = None,
) -> dict[str, int]:
    """The counters from the cluster's first refresh after this call: it refreshes them
    about every 5 s, and its own background transactions (about one commit every 2 s, a
    write every 5 s) move them at every refresh, so the first change seen is one. With
    ``past`` (the reading before a drain), also not before its writes and commits moved
    past it: the roles publish their counters apart, and a reading after a drain once
    showed its reads and none of its writes (a CI run, load 3.8)."""
    first = server_counters(fdbcli, cluster)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server_counters(fdbcli, cluster)
        if now != first and (past is None or all(now[k] > past[k] for k in DRAIN_MOVES)):
            return now
    raise RuntimeError(f"the cluster's counters did not move in {timeout_s} s")


def fill(url: str, items: int, tenants: int) -> None:
    """``items`` no-op items, spread evenly over ``tenants`` tenants of one app."""
    from quickzones.client import Quick

    q = Quick.open(url)
    try:
        per = items // tenants
        for t in range(tenants):
            count = per + (1 if t < items % tenants else 0)
            for start in range(0, count, 100):
                q.enqueue_many(NOOP, [b""] * min(100, count - start), app="b", tenant=f"t{t}")
    finally:
        q.close()


def summed_profile(raw: str) -> str:
    """py-spy's raw (collapsed) stacks summed by function: own samples, and samples with
    the function anywhere on the stack (once per stack)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [f.rsplit(":", 1)[0] if f.count(":") > 1 else f for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    lines = [f"{samples} samples with the GIL", "", "own  %  function"]
    lines += [f"{n:5d} {100 * n / samples:5.1f} {f}" for f, n in own.most_common(60)]
    lines += ["", "with callees  %  function"]
    lines += [f"{n:5d} {100 * n / samples:5.1f} {f}" for f, n in total.most_common(80)]
    return "\n".join(lines) + "\n"


def one_run(
    python: str,
    url: str,
    items: int,
    overrides: str,
    fdbcli: str,
    cluster: Path,
    py_spy: str | None,
    profile_to: Path | None,
) -> dict[str, Any]:
    child = subprocess.Popen(
        [python, os.path.abspath(__file__), "--child", url, str(items), overrides],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    pid = json.loads(child.stdout.readline())["ready"]
    before = fresh_counters(fdbcli, cluster)
    spy = None
    if py_spy and profile_to is not None:
        prof = str(profile_to)
        spy = subprocess.Popen(
            [py_spy, "record", "--gil", "-f", "raw", "-r", "250", "-p", str(pid), "-o", prof],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
    load = os.getloadavg()[0]
    child.stdin.write("go\n")
    child.stdin.flush()
    done = json.loads(child.stdout.readline())
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    child.wait(timeout=60)
    after = fresh_counters(fdbcli, cluster, past=before)
    n = done["items"]
    server = {f"{k}_per_item": (after[k] - before[k]) / n for k in COUNTERS}
    return {
        **done,
        "cpu_s_per_1000": done["cpu_s"] / n * 1000,
        "items_per_s": n / done["wall_s"],
        **server,
        "load": load,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fdb_cpu", description=__doc__)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--tenants", default="1,200", help="comma-separated shapes: tenants per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", default="", help="another tree's python (its virtualenv)")
    ap.add_argument("--py-spy", default="", help="py-spy binary: profile this tree's drains")
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--consumer",
        default="{}",
        help="ConsumerConfig fields over the defaults, as JSON: '{\"processing_bound\": 40}'",
    )
    ap.add_argument(
        "--query",
        default="",
        help="fdb:// URL options for this tree's drains only: 'snapshot_reads=0'",
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        drain_child(args.child[0], int(args.child[1]), json.loads(args.child[2]))
        return 0
    from bench.common import fdb_url, log, machine, run_folder, summary
    from quickzones.testing.provision.fdb import find_fdb_dist, shared_fdb_cluster_file

    cluster = shared_fdb_cluster_file()
    dist = find_fdb_dist()
    fdbcli = dist.fdbcli if dist is not None else "fdbcli"
    out = run_folder("fdb-cpu", args.out)
    trees = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    shapes = [int(t) for t in args.tenants.split(",")]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        str(t): {name: [] for name in trees} for t in shapes
    }
    for i in range(args.runs):
        for tenants in shapes:
            # Alternate which tree goes first, so a busy stretch falls on both.
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for name in order:
                # Tags of one length: the prefix is in every key the server counts bytes of.
                url = fdb_url(f"cpu-{name[0]}-{tenants}-{i}")
                fill(url, args.items, tenants)
                if args.query and name == "this":
                    url += ("&" if "?" in url else "?") + args.query
                prof = out / f"py-spy-{tenants}-{i}.txt" if name == "this" else None
                r = one_run(
                    trees[name], url, args.items, args.consumer, fdbcli, cluster, args.py_spy, prof
                )
                if prof is not None and prof.exists():
                    (out / f"py-spy-{tenants}-{i}-summed.txt").write_text(
                        summed_profile(prof.read_text())
                    )
                runs[str(tenants)][name].append(r)
                log(
                    f"run {i + 1}/{args.runs} {tenants} tenants {name}: "
                    f"{r['cpu_s_per_1000']:.2f} CPU s/1000, {r['items_per_s']:.0f}/s, "
                    f"{r['writes_per_item']:.2f} writes, {r['commits_per_item']:.3f} commits, "
                    f"{r['bytes_written_per_item']:.0f} B per item, {r['visits']} visits, "
                    f"{r['switches_per_item']:.1f} context switches per item "
                    f"(load {r['load']:.1f})"
                )
    keys = ("cpu_s_per_1000", "items_per_s", *(f"{k}_per_item" for k in COUNTERS))
    medians = {
        shape: {
            name: {k: summary([r[k] for r in rs])["median"] for k in keys}
            for name, rs in by_tree.items()
        }
        for shape, by_tree in runs.items()
    }
    res = {
        "command": "python -m bench.fdb_cpu " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "items": args.items,
        "runs": runs,
        "medians": medians,
    }
    (out / "fdb_cpu.json").write_text(json.dumps(res, indent=1))
    for shape, by_tree in medians.items():
        for name, m in by_tree.items():
            log(f"{shape} tenants, {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in m.items()))
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One-transaction against three-transaction zone visits with several consumer processes
competing for the same zones.

``python -m bench.visits_contention [--n 5000] [--runs 3] [--backends fdb,sqlite]
[--tenants 50,1] [--consumers 3] [--visits both|one-batched|...] [--batch 16] [--out DIR]``

``--visits one-batched`` sets one-transaction visits against batched ones (up to
``--batch`` zones per transaction, ``visits_per_transaction``).

Each run starts ``--consumers`` consumer processes (``python -m bench.quickrun``, the
lone-tenant bench's ``throughput_config(workers=4, dequeue_max=10)``, with
``one_transaction_visits`` on or off) on an empty queue, waits until every one is running,
then enqueues ``n`` no-op items spread evenly over ``--tenants`` tenants (batches of 100,
one zone per tenant), all vesting at one moment ``T``, ``--lead`` s (4) after the enqueue
started (a run whose enqueue ended later says so), so all consumers are polling when the
items vest. Every job records its start with its item
id (:func:`bench.common.record_start`). Once every enqueued id has started (or 90 s
passed), the consumers get a second's grace and SIGTERM, and write their event counters.

Per run: the drain time ``last first-start - T`` and rate ``n / drain``; the consumers'
``one_transaction_visit_conflict`` and ``pointer_lease_failed`` events (by reason),
visits and completions; and, from the ids, items started twice or more (``duplicates``,
extra starts) and enqueued items never started (``lost``). With ``--visits both`` the two
modes alternate which goes first, run by run, inside each backend and tenant count.

Results: ``bench/results/<UTC timestamp>-visits-contention/visits_contention.json`` (or
``--out``).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import REPO, child_env, fdb_url, log, machine, read_records, run_folder, summary
from bench.quickrun import JOB, config_to_json, open_quick, throughput_config

LEAD_S = 4.0  # the items vest this long after the enqueue started (checked: after it ended)


def _start_consumers(
    url: str, k: int, cfg_json: str, work: Path, env: dict[str, str]
) -> list[tuple[subprocess.Popen[bytes], Path, Path]]:
    procs = []
    for c in range(k):
        ready, done = work / f"ready-{c}", work / f"done-{c}.json"
        cmd = [sys.executable, "-m", "bench.quickrun", url, "--config", cfg_json]
        cmd += ["--seconds", "150", "--ready", str(ready), "--done", str(done)]
        with open(work / f"consumer-{c}.log", "ab") as lf:
            p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=lf, stderr=lf)
        procs.append((p, ready, done))
    return procs


def _stop_consumers(procs: list[tuple[subprocess.Popen[bytes], Path, Path]]) -> None:
    for p, _, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p, _, _ in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def one_run(
    url: str,
    n: int,
    tenants: int,
    consumers: int,
    one: bool,
    work: Path,
    lead_s: float = LEAD_S,
    batch: int = 1,
) -> dict:
    out = work / "records.txt"
    out.write_bytes(b"")
    env = child_env(BENCH_OUT=str(out))
    cfg = throughput_config(
        workers=4, dequeue_max=10, one_transaction_visits=one, visits_per_transaction=batch
    )
    procs = _start_consumers(url, consumers, config_to_json(cfg), work, env)
    try:
        deadline = time.time() + 60
        while not all(r.exists() for _, r, _ in procs):
            if time.time() > deadline or any(p.poll() is not None for p, _, _ in procs):
                raise RuntimeError(f"consumers did not start; see {work}/consumer-*.log")
            time.sleep(0.05)
        q = open_quick(url)
        t_enq = time.time()
        due = t_enq + lead_s
        per = [n // tenants + (1 if i < n % tenants else 0) for i in range(tenants)]
        ids: list[str] = []
        for i, count in enumerate(per):
            tenant = f"t{i:03d}"
            for j in range(0, count, 100):
                k = min(100, count - j)
                delay = max(0.0, due - time.time())
                payloads = [{"t": tenant, "e": t_enq, "d": due, "i": 1}] * k
                ids += q.enqueue_many(JOB, payloads, app="b", tenant=tenant, delay=delay)
        enqueue_s = time.time() - t_enq
        q.close()
        if enqueue_s > lead_s:
            log(f"enqueue took {enqueue_s:.2f} s, longer than the {lead_s} s lead")
        wanted = set(ids)
        deadline = time.time() + 90
        started: set[str] = set()
        while time.time() < deadline:
            started = {r.item for r in read_records(out)} & wanted
            if len(started) >= len(wanted):
                break
            time.sleep(0.1)
        time.sleep(1.0)  # grace: a second start of some item would show here
    finally:
        _stop_consumers(procs)
    recs = read_records(out)
    first: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for r in recs:
        counts[r.item] += 1
        first[r.item] = min(first.get(r.item, r.start), r.start)
    firsts = sorted(first[i] for i in wanted if i in first)
    drain_s = (firsts[-1] - due) if len(firsts) == len(wanted) else float("nan")
    stats: list[dict[str, Any]] = []
    for p, _, done in procs:
        d = json.loads(done.read_text()) if done.exists() else {}
        s = d.get("stats", {})
        stats.append(
            {
                "returncode": p.returncode,
                "completed": s.get("completed", 0),
                "visited": s.get("visited", 0),
                "pointer_leased": s.get("pointer_leased", 0),
                "one_transaction_visit_conflict": s.get("one_transaction_visit_conflict", 0),
                "pointer_lease_failed": s.get("pointer_lease_failed", 0),
                "lease_failed_reasons": d.get("lease_failed", {}),
                "one_tx": d.get("one_transaction_visits", {}),
                "errors": {k: v for k, v in s.items() if "error" in k},
            }
        )

    def total(key: str) -> int:
        return sum(s[key] for s in stats)

    reasons: Counter[str] = Counter()
    one_tx: Counter[str] = Counter()
    for s in stats:
        reasons.update(s["lease_failed_reasons"])
        one_tx.update(s["one_tx"])
    return {
        "visits": "one" if one else "three",
        "tenants": tenants,
        "enqueued": len(wanted),
        "enqueue_s": enqueue_s,
        "lead_s": lead_s,
        "enqueue_ended_after_due": enqueue_s > lead_s,
        "started_distinct": len(started),
        "lost": len(wanted) - len(set(first) & wanted),
        "duplicate_items": sum(1 for i, c in counts.items() if c > 1 and i in wanted),
        "extra_starts": sum(c - 1 for i, c in counts.items() if c > 1 and i in wanted),
        "unknown_starts": sum(c for i, c in counts.items() if i not in wanted),
        "drain_s": drain_s,
        "rate": len(wanted) / drain_s if drain_s == drain_s else float("nan"),
        "first_start_after_due_ms": (firsts[0] - due) * 1000 if firsts else float("nan"),
        "completed": total("completed"),
        "visited": total("visited"),
        "one_transaction_visit_conflict": total("one_transaction_visit_conflict"),
        "pointer_lease_failed": total("pointer_lease_failed"),
        "lease_failed_reasons": dict(reasons),
        # one-transaction visits tried (the gate let them), committed, conflicted
        "one_tx": dict(one_tx),
        "per_consumer": stats,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.visits_contention")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backends", default="fdb,sqlite")
    ap.add_argument("--tenants", default="50,1")
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument(
        "--visits",
        choices=["three", "one", "both", "batched", "one-batched"],
        default="both",
        help="both: three and one; batched: one transaction for up to --batch zones; "
        "one-batched: one and batched",
    )
    ap.add_argument("--batch", type=int, default=16, help="visits_per_transaction (batched)")
    ap.add_argument("--out", default="", help="results directory")
    ap.add_argument(
        "--lead", type=float, default=LEAD_S, help="s from the enqueue's start to the vesting"
    )
    args = ap.parse_args(argv)
    visits = {"both": ["three", "one"], "one-batched": ["one", "batched"]}.get(
        args.visits, [args.visits]
    )
    tenant_counts = [int(t) for t in args.tenants.split(",")]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-visits-") as tmp:
        for r in range(args.runs):
            order = visits if r % 2 == 0 else visits[::-1]
            for b in args.backends.split(","):
                for tenants in tenant_counts:
                    for v in order:
                        name = f"{b}-{tenants}t-{v}"
                        work = Path(tmp) / f"{name}-{r}"
                        work.mkdir()
                        url = fdb_url(f"vc{r}") if b == "fdb" else f"sqlite:///{work}/q.db"
                        res = one_run(
                            url,
                            args.n,
                            tenants,
                            args.consumers,
                            v != "three",
                            work,
                            args.lead,
                            batch=args.batch if v == "batched" else 1,
                        )
                        res.update(backend=b, run=r, name=name)
                        runs.append(res)
                        log(
                            f"run {r + 1}/{args.runs} {name}: {res['rate']:.0f} items/s, "
                            f"drain {res['drain_s']:.2f} s, "
                            f"1tx conflicts {res['one_transaction_visit_conflict']}, "
                            f"lease failed {res['pointer_lease_failed']}, "
                            f"1tx tried/committed {res['one_tx'].get('tried', 0)}"
                            f"/{res['one_tx'].get('committed', 0)} of {res['visited']} visits, "
                            f"lost {res['lost']}, twice+ {res['duplicate_items']}"
                        )
    groups: dict[str, list[dict[str, Any]]] = {}
    for res in runs:
        groups.setdefault(res["name"], []).append(res)
    medians = {
        name: {
            "rate": summary([x["rate"] for x in rs]),
            "one_transaction_visit_conflict": summary(
                [x["one_transaction_visit_conflict"] for x in rs]
            ),
            "pointer_lease_failed": summary([x["pointer_lease_failed"] for x in rs]),
            "one_tx_tried": summary([x["one_tx"].get("tried", 0) for x in rs]),
            "one_tx_committed": summary([x["one_tx"].get("committed", 0) for x in rs]),
            "visited": summary([x["visited"] for x in rs]),
            "runs_enqueue_after_due": sum(x["enqueue_ended_after_due"] for x in rs),
            "lost_total": sum(x["lost"] for x in rs),
            "duplicate_items_total": sum(x["duplicate_items"] for x in rs),
        }
        for name, rs in groups.items()
    }
    ratios: dict[str, Any] = {}
    for name, rs in groups.items():
        if name.endswith("-one") and name[: -len("-one")] + "-three" in groups:
            base = name[: -len("-one")]
            three = groups[base + "-three"]
            ratios[base] = {
                "median_rate_one_to_three": medians[name]["rate"]["median"]
                / medians[base + "-three"]["rate"]["median"],
                "pairs": [o["rate"] / t["rate"] for o, t in zip(rs, three, strict=True)],
            }
        if name.endswith("-batched") and name[: -len("-batched")] + "-one" in groups:
            base = name[: -len("-batched")]
            one = groups[base + "-one"]
            ratios[base + " batched"] = {
                "median_rate_batched_to_one": medians[name]["rate"]["median"]
                / medians[base + "-one"]["rate"]["median"],
                "pairs": [b["rate"] / o["rate"] for b, o in zip(rs, one, strict=True)],
            }
    res_all: dict[str, Any] = {
        "n": args.n,
        "runs": args.runs,
        "consumers": args.consumers,
        "config": "throughput_config(workers=4, dequeue_max=10, one_transaction_visits=..., "
        f"visits_per_transaction={args.batch} when batched)",
        "machine": machine(),
        "command": "python -m bench.visits_contention " + " ".join(argv or sys.argv[1:]),
        "summary": medians,
        "ratio_one_to_three": ratios,
        "all_runs": runs,
    }
    out = run_folder("visits-contention", args.out)
    path = out / f"visits_contention-{'-'.join(args.backends.split(','))}.json"
    path.write_text(json.dumps(res_all, indent=1))
    for name, m in medians.items():
        log(
            f"{name}: median {m['rate']['median']:.0f} items/s "
            f"({m['rate']['min']:.0f}-{m['rate']['max']:.0f}), "
            f"conflicts median {m['one_transaction_visit_conflict']['median']}, "
            f"lease failed median {m['pointer_lease_failed']['median']}, "
            f"1tx committed median {m['one_tx_committed']['median']} "
            f"of {m['visited']['median']} visits, "
            f"lost {m['lost_total']}, twice+ {m['duplicate_items_total']}"
        )
    for base, ra in ratios.items():
        for key, label in (("median_rate_one_to_three", "one/three"),
                           ("median_rate_batched_to_one", "batched/one")):  # fmt: skip
            if key in ra:
                log(f"{base}: {label} {ra[key]:.3f} (pairs {ra['pairs']})")
    log(f"results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

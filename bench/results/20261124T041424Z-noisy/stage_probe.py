"""The noisy-neighbour workload (bench.peer_workloads.noisy_neighbour, quick's peer config,
sqlite, one consumer process) with a traced consumer: where a small tenant's item spends
its time from enqueue to handler start.

PYTHONPATH=. python bench/results/<stamp>/stage_probe.py sqlite|memory three|one [out.json|-] ['{"managers": 2}']
Env for experiments in the consumer process (traced_run.py): NO_GATE=1 (a one-transaction
visit's conflict does not hold the next visits to three transactions), RESCAN_MULT=k
(re-scan when the selected deque is k x idle_sleep_s old instead of 10x), SWITCH_S=s
(sys.setswitchinterval), TAG=label (in the JSON line).
"""
from __future__ import annotations

import bisect
import dataclasses
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench.peers.quick_peer as qp
from bench import peer_workloads as w
from bench.common import read_records
from quickzones import enqueue as enqueue_mod

HERE = Path(__file__).resolve().parent
backend, visits_mode = sys.argv[1], sys.argv[2]
one = visits_mode == "one"
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
_orig = qp.peer_config
qp.peer_config = lambda throughput=False: dataclasses.replace(
    _orig(throughput), one_transaction_visits=one, **extra
)

# producer side: when enqueue returns, when part two starts/ends
prod: dict = {}
tl = threading.local()
_part_two = enqueue_mod.part_two


def part_two(toplevel, zone, vesting_ms):
    tl.p2 = time.time()
    _part_two(toplevel, zone, vesting_ms)
    tl.p2e = time.time()


enqueue_mod.part_two = part_two
# QuickPeer.enqueue stamps e=time.time() itself; patch to pass ours through
def enqueue_exact(self, tenant, work_ms=0.0):
    tl.p2 = tl.p2e = None
    t = time.time()
    self.q.enqueue(qp.JOB, {"t": tenant, "e": t, "d": t, "w": work_ms}, app="b", tenant=tenant)
    prod[(tenant, f"{t:.6f}")] = (t, tl.p2, tl.p2e, time.time())


qp.QuickPeer.enqueue = enqueue_exact


def worker_cmd(self):
    return [sys.executable, str(HERE / "traced_run.py"), self._url(),
            json.dumps(dataclasses.asdict(qp.peer_config(self.throughput)))]


qp.QuickPeer.worker_cmd = worker_cmd
if backend == "memory":
    sys.path.insert(0, str(HERE))
    import traced_run as tr_mod

    def start_worker(self):
        self.out.write_bytes(b"")
        self.consumer = self.q.consumer(qp.peer_config(self.throughput), observer=tr_mod.observer)
        self.consumer.start()

    qp.QuickPeer.start_worker = start_worker

with tempfile.TemporaryDirectory() as d:
    peer = qp.QuickPeer(Path(d), backend)
    trace_path = Path(d) / "trace.json"
    peer.env["TRACE_OUT"] = str(trace_path)
    peer.env["PYTHONPATH"] = str(HERE.parents[2])
    try:
        r = w.noisy_neighbour(peer, 10, 5.0, 5.0)
        recs = read_records(peer.out)
    finally:
        peer.close()
    if backend == "memory":
        trace = {"scans": tr_mod.scans, "visits": tr_mod.visits, "items": tr_mod.items,
                 "commits": [], "cpu": [], "gcs": tr_mod.gcs}
    else:
        trace = json.loads(trace_path.read_text())

s, n = r["small"], r["noisy"]
print(backend, visits_mode, extra, "small p50 %.1f p99 %.1f" % (s["p50"], s["p99"]),
      "noisy p50 %.1f p99 %.1f" % (n["p50"], n["p99"]))

# join: records (tenant, e, start) <- prod (tenant, e) ; consumer items by (tenant, enq_ms nearest >= e)
by_tenant: dict = {}
for iid, it in trace["items"].items():
    by_tenant.setdefault(it["tenant"], []).append(it)
for lst in by_tenant.values():
    lst.sort(key=lambda it: it["enq_ms"])
# scans: for each (pid, vest) the first scan end that chose it
first_seen: dict = {}
for t0, t1, chosen, left in trace["scans"]:
    for pid, vest in chosen:
        first_seen.setdefault((pid, vest), t1)

rows = []
for rec in recs:
    if not rec.tenant.startswith("t"):
        continue
    p = prod.get((rec.tenant, f"{rec.enq:.6f}"))
    lst = by_tenant.get(rec.tenant, [])
    keys = [it["enq_ms"] for it in lst]
    i = bisect.bisect_left(keys, rec.enq * 1000 - 1)
    if p is None or i >= len(lst):
        continue
    it = lst[i]
    e = rec.enq
    p1 = p[1] if p[1] else p[3]  # part one committed (part two start) or enqueue end
    done = p[3]
    vest = it["vest"] / 1000
    seen = first_seen.get((it["pid"], it["vest"]))
    rows.append({
        "total": (rec.start - e) * 1000,
        "part_one": (p1 - e) * 1000,
        "part_two": (done - p1) * 1000,
        # pointer visible vested (ref vesting or part two done) -> first scan choosing it
        "to_scan": (seen - max(vest, done if vest > e - 0.001 else e)) * 1000 if seen else None,
        "scan_to_visit": (it["vt0"] - seen) * 1000 if seen else None,
        "e_to_visit": (it["vt0"] - e) * 1000,
        "lease": (it["leased"] - it["vt0"]) * 1000 if it["leased"] else None,
        "dequeue": (it["deq"] - (it["leased"] or it["vt0"])) * 1000,
        "local_queue": (it.get("exec", it["deq"]) - it["deq"]) * 1000,
        "exec_to_handler": (rec.start - it.get("exec", it["deq"])) * 1000,
        "vested_before_enq": vest < e,
        "e": e,
    })


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, int(round(q / 100 * len(xs) + 0.5)) - 1))]


print("matched", len(rows), "of", sum(1 for r_ in recs if r_.tenant.startswith("t")))
print("%-16s %8s %8s %8s" % ("stage", "p50", "p90", "p99"))
for k in ["total", "part_one", "part_two", "to_scan", "scan_to_visit", "e_to_visit", "lease",
          "dequeue", "local_queue", "exec_to_handler"]:
    xs = [r_[k] for r_ in rows]
    print("%-16s %8.1f %8.1f %8.1f" % (k, pct(xs, 50), pct(xs, 90), pct(xs, 99)))
worst = sorted(rows, key=lambda r_: -r_["total"])[:10]
print("worst 10:")
for r_ in worst:
    print("  " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) and k != "e" else f"{k}={v}" for k, v in r_.items() if k != "e"),
          "at %.2fs" % (r_["e"] - min(x["e"] for x in rows)))
nv = trace["visits"]
print("visits", len(nv), "scans", len(trace["scans"]),
      "visit ms p50 %.1f p99 %.1f" % (pct([(v["t1"] - v["t0"]) * 1000 for v in nv], 50),
                                      pct([(v["t1"] - v["t0"]) * 1000 for v in nv], 99)))
import collections
print("rare events:", collections.Counter((x[1], x[2] if x[1] != "one_transaction_visit_conflict" else "") for x in trace.get("rare", [])))
gcs = trace["gcs"]
t00 = min(x["e"] for x in rows)
for g in range(3):
    ds = [x[2] for x in gcs if x[1] == g]
    print("gc gen%d: n=%d total %.1f ms max %.1f ms" % (g, len(ds), sum(ds), max(ds, default=0)),
          [("%.2fs" % (x[0] - t00), round(x[2], 1)) for x in gcs if x[1] == g and x[2] > 5][:12])
if len(sys.argv) > 3 and sys.argv[3] != "-":
    Path(sys.argv[3]).write_text(json.dumps({"result": r, "rows": rows, "scans": trace["scans"], "visits": nv, "commits": trace["commits"], "cpu": trace["cpu"], "gcs": trace["gcs"], "rare": trace.get("rare", [])}))
import os as _os
_tot = [r_["total"] for r_ in rows]
print("JSON " + json.dumps({"mode": visits_mode, "extra": extra, "nogate": bool(_os.environ.get("NO_GATE")), "tag": _os.environ.get("TAG", ""),
                            "small_p50": s["p50"], "small_p90": pct(_tot, 90), "small_p99": s["p99"],
                            "small_mean": sum(_tot) / len(_tot), "noisy_p50": n["p50"], "noisy_p99": n["p99"],
                            "conflicts": sum(1 for x in trace.get("rare", []) if x[1].startswith("one")),
                            **{k + "_p99": pct([r_[k] for r_ in rows], 99) for k in ["to_scan", "scan_to_visit", "lease", "dequeue", "local_queue"]}}))

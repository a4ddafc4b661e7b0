"""What one FoundationDB transaction costs a client process, by how it gets its read
version, and what the GRV cache costs an idle process (issue 44 point 5).

``python -m bench.fdb_txn_cost [--txns 1500] [--runs 3] [--variants ...]``

Each variant runs in a child process of its own (network options are per process), on
the bench's shared local ``fdbserver``, in one thread that is not the main one (as a
consumer's managers are, with ``backends/fdb/waits.py`` installed): ``--txns``
transactions back to back, after 200 to warm up, and reports the process CPU
(``time.process_time``, libfdb_c's network thread included) and wall time per
transaction. Variants, ``read*`` doing one point read and ``write*`` one atomic add and a
commit:

* ``read``, ``write``: a new transaction each, a fresh read version (the default);
* ``*_grvcache``: ``use_grv_cache`` (with the network option ``disable_client_bypass``);
* ``*_bypass``: ``disable_client_bypass`` alone (the multi-version layer the cache needs);
* ``*_setrv``: ``set_read_version`` with a version at most 100 ms old (the ceiling of any
  read-version reuse);
* ``*_reset``: one transaction ``reset()`` between uses instead of a new one;
* ``idle_plain``, ``idle_grvcache``: one transaction, then 20 s asleep: CPU % of a core.

The variants alternate within each run. Results: ``bench/results/<UTC>-fdb-txn-cost/``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import threading
import time
from typing import Any

VARIANTS = (
    "read",
    "read_grvcache",
    "read_bypass",
    "read_setrv",
    "read_reset",
    "write",
    "write_grvcache",
    "write_setrv",
    "write_reset",
    "idle_plain",
    "idle_grvcache",
)


def child(cluster: str, variant: str, txns: int) -> dict[str, Any]:
    from quickzones.backends.fdb import waits
    from quickzones.backends.fdb.loader import import_binding, select_api_version

    fdb = import_binding()
    select_api_version(fdb, 730)
    if "grvcache" in variant or "bypass" in variant:
        fdb.options.set_disable_client_bypass()
    waits.install(fdb)
    db = fdb.open(cluster)
    key = f"txn-cost-{os.getpid()}/k".encode()
    db[key] = b"x"  # retried: the multi-version client's first transaction may meet 1039
    one = struct.pack("<q", 1)
    out: dict[str, Any] = {"variant": variant}
    if variant.startswith("idle"):
        tr = db.create_transaction()
        if "grvcache" in variant:
            tr.options.set_use_grv_cache()
        tr.get(key).wait()
        time.sleep(1.0)
        cpu0 = time.process_time()
        time.sleep(20.0)
        out["idle_pct_of_core"] = (time.process_time() - cpu0) / 20.0 * 100
        return out
    recent = [0, -1.0]

    def body() -> None:
        for _ in range(200):
            warm = db.create_transaction()  # held: a dropped transaction cancels its reads
            warm.get(key).wait()
        cpu0, t0 = time.process_time(), time.perf_counter()
        tr = db.create_transaction()
        for _ in range(txns):
            if variant.endswith("_reset"):
                tr.reset()
            else:
                tr = db.create_transaction()
            if "grvcache" in variant:
                tr.options.set_use_grv_cache()
            if variant.endswith("_setrv"):
                now = time.monotonic()
                if now - recent[1] > 0.1:
                    recent[0], recent[1] = tr.get_read_version().wait(), now
                else:
                    tr.set_read_version(recent[0])
            if variant.startswith("write"):
                tr.add(key + b"c", one)
                tr.commit().wait()
            else:
                tr.get(key).wait()
        out["cpu_us"] = (time.process_time() - cpu0) / txns * 1e6
        out["wall_us"] = (time.perf_counter() - t0) / txns * 1e6

    thread = threading.Thread(target=body, name="bench")
    thread.start()
    thread.join()
    if "cpu_us" not in out:
        raise RuntimeError(f"variant {variant} failed: its thread's error is above")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fdb_txn_cost", description=__doc__)
    ap.add_argument("--txns", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))), flush=True)
        return 0
    from bench.common import log, machine, run_folder, summary
    from quickzones.testing.provision.fdb import shared_fdb_cluster_file

    cluster = str(shared_fdb_cluster_file())
    out = run_folder("fdb-txn-cost", args.out)
    variants = args.variants.split(",")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for i in range(args.runs):
        for variant in variants if i % 2 == 0 else list(reversed(variants)):
            done = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    cluster,
                    variant,
                    str(args.txns),
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=300,
            )
            r = {**json.loads(done.stdout.strip().splitlines()[-1]), "load": os.getloadavg()[0]}
            runs[variant].append(r)
            log(f"run {i + 1}/{args.runs} {json.dumps(r)}")
    medians = {
        v: {
            k: summary([r[k] for r in rs])["median"]
            for k in ("cpu_us", "wall_us", "idle_pct_of_core")
            if rs and k in rs[0]
        }
        for v, rs in runs.items()
    }
    res = {
        "command": "python -m bench.fdb_txn_cost " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "runs": runs,
        "medians": medians,
    }
    (out / "fdb_txn_cost.json").write_text(json.dumps(res, indent=1))
    for v, m in medians.items():
        log(f"{v}: " + ", ".join(f"{k} {x:.3g}" for k, x in m.items()))
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

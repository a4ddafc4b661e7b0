"""Profile the core bench's end-to-end case on fdb://: one consumer process (the bench's
``throughput_config``) while this process enqueues 3,000 no-op items over 100 zones in
batches of 100, exactly as ``bench.core_throughput.end_to_end`` does.

    FDB_BIN_DIR=../shared/fdb/bin flock /work/bench.lock \
        python -m bench.profiles.fdb_e2e OUT_DIR [--spy] [--n 3000]

Writes OUT_DIR/summary.json: the rate, the CPU per item of each process and, with
``--count``, per item the consumer's transactions, commits, point reads (``get_many``
batches and the keys they held) and range reads, counted by wrapping ``FDBTransaction``.
``--spy gil`` records the consumer with ``py-spy record --gil`` (consumer_gil.txt, for
``bench/profiles/aggregate.py``); ``--spy all`` records every thread, waits included
(consumer_all.txt; ``--nonblocking``, so sampling does not pause the process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, fdb_url
from bench.core_throughput import _fill, _wait_file, consumer_command
from bench.quickrun import open_quick

COUNTER = """
import atexit, collections, json, os
from quickzones.backends.fdb import store as _s
_c = collections.Counter()
T = _s.FDBTransaction
def _wrap(name):
    orig = getattr(T, name)
    def w(self, *a, **k):
        _c[name] += 1
        if name == "get_many":
            _c["get_many_keys"] += len(a[0])
        return orig(self, *a, **k)
    setattr(T, name, w)
for _n in ("get", "get_many", "get_range", "commit", "set", "clear", "add"):
    _wrap(_n)
_orig_init = T.__init__
def _init(self, *a, **k):
    _c["transactions"] += 1
    _orig_init(self, *a, **k)
T.__init__ = _init
import fdb.impl as _impl
_on_ready = _impl.Future.on_ready
def _counted_on_ready(self, callback):
    _c["binding_callbacks"] += 1
    return _on_ready(self, callback)
_impl.Future.on_ready = _counted_on_ready
atexit.register(lambda: open(os.environ["COUNT_OUT"], "w").write(json.dumps(_c)))
"""


def _fdbserver_cpu_s() -> float:
    """CPU seconds (user + system) of every fdbserver process on this machine."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(fdbserver)" not in text:
            continue
        fields = text.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--spy", choices=("gil", "all"), default=None)
    ap.add_argument("--count", action="store_true", help="count the consumer's KV calls")
    ap.add_argument(
        "--drain", action="store_true", help="fill first, then start the consumer (the drain case)"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url = fdb_url("prof")
    n = args.n
    with tempfile.TemporaryDirectory() as tmp:
        done, ready = os.path.join(tmp, "done.json"), os.path.join(tmp, "ready")
        cmd = consumer_command(url, n, done, ready, 120)
        env = dict(os.environ)
        if args.count:
            site = os.path.join(tmp, "site")
            os.mkdir(site)
            Path(site, "sitecustomize.py").write_text(COUNTER)
            env["PYTHONPATH"] = os.pathsep.join([site, str(REPO)])
            env["COUNT_OUT"] = str(out / "counts.json")
        if args.spy:
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            extra = ["--gil"] if args.spy == "gil" else ["--idle", "--threads", "--nonblocking"]
            cmd = [
                spy,
                "record",
                *extra,
                "-r",
                "500",
                "--format",
                "raw",
                "-o",
                str(out / f"consumer_{args.spy}.txt"),
                "--",
                *cmd,
            ]
        q = open_quick(url)
        if args.drain:
            c0 = time.process_time()
            t_fill = time.time()
            _fill(q, n, args.tenants)
            t_fill = time.time() - t_fill
            producer_cpu = time.process_time() - c0
        server0 = _fdbserver_cpu_s()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env)
        _wait_file(ready, 60)
        t0, c0 = time.time(), time.process_time()
        if not args.drain:
            _fill(q, n, args.tenants)
            t_fill = time.time() - t0
            producer_cpu = time.process_time() - c0
        proc.wait(200)
        server_cpu = _fdbserver_cpu_s() - server0
        q.close()
        res = json.loads(Path(done).read_text())
    after = res["done_at"] - t0 - t_fill
    if args.drain:
        t0 = res["started_at"]  # the drain case: from the consumer's start
        after = res["done_at"] - t0
    summary = {
        "n": n,
        "mode": "drain" if args.drain else "end_to_end",
        "items_per_s": n / (res["done_at"] - t0),
        "after_fill_s": after,
        "producer_fill_s": t_fill,
        "producer_cpu_us_per_item": producer_cpu / n * 1e6,
        "consumer_cpu_us_per_item": (res["cpu_s"] - res["cpu_ready_s"]) / n * 1e6,
        # Every fdbserver on the machine (the bench's own, and any other session's).
        "fdbserver_cpu_us_per_item": server_cpu / n * 1e6,
        "stats": res["stats"],
    }
    counts = out / "counts.json"
    if counts.exists():
        c = json.loads(counts.read_text())
        summary["consumer_calls_per_item"] = {k: round(v / n, 3) for k, v in sorted(c.items())}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "stats"}, indent=1))


if __name__ == "__main__":
    main()

"""``python -m bench [--quick] [--runs N] [--only NAME] [--publish]``.

Sections: core (throughput targets), scale (collected tenants, RSS), paper (section 8
reproductions), peers (RQ, Dramatiq, Celery, Huey, procrastinate). Results go to
``bench/results/<UTC timestamp>/`` (one JSON per section, PNG plots, report.md), which git
leaves untracked; ``--publish`` also copies the report to ``bench/REPORT.md``, the tracked
report (``bench/results/README.md`` says how a run the docs cite is kept).

Standalone runs beside these sections, each ``python -m bench.<name>`` and each run by
``nox -s bench``: ``peers_users`` (what users see beside the peers: single enqueues,
``quick worker`` with its defaults; the peers section keeps its tuned profiles and batch
enqueues), ``delayed_lateness``, ``noisy_pickup``, ``demo``, ``postgres_peer``,
``postgres_pickup``, ``pg_long_txn`` (PostgreSQL beside a long transaction).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, fdb_available, log, machine, run_folder

SECTIONS = ("core", "scale", "paper", "peers", "fdb")


def _backends() -> list[str]:
    try:
        import quickzones.backends.sqlite  # noqa: F401

        return ["memory", "sqlite"]
    except ImportError:
        log("quickzones.backends.sqlite not importable: memory:// only")
        return ["memory"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="single run, small sizes (< 3 min)")
    ap.add_argument(
        "--runs", type=int, default=None, help="repetitions (default 5; 1 with --quick)"
    )
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    ap.add_argument("--out", default=None, help="results folder (default bench/results/<ts>)")
    ap.add_argument(
        "--backends",
        default=None,
        help="comma-separated subset of memory,sqlite,fdb (default: all available)",
    )
    ap.add_argument(
        "--report-only", default=None, metavar="DIR", help="rebuild report.md from DIR's JSON"
    )
    ap.add_argument(
        "--publish", action="store_true", help="also copy the report to bench/REPORT.md"
    )
    args = ap.parse_args(argv)
    if args.report_only:
        return _report(Path(args.report_only), args.publish)
    runs = args.runs or (1 if args.quick else 5)
    sections = args.only or list(SECTIONS)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = run_folder("", args.out)

    # SIGTERM becomes SystemExit so context managers stop the servers we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    backends = _backends()
    # fdb:// (a real FoundationDB, started by the run) joins the sections that measure the
    # store: core throughput and the paper's experiments; scale and peers stay as they were.
    with_fdb = [*backends, "fdb"] if fdb_available() else backends
    if "fdb" not in with_fdb:
        log("no FoundationDB (FDB_BIN_DIR, ../shared/fdb, FDB_CLUSTER_FILE): no fdb:// numbers")
    if args.backends:
        wanted = args.backends.split(",")
        backends = [b for b in backends if b in wanted]
        with_fdb = [b for b in with_fdb if b in wanted]
    meta: dict[str, Any] = {
        "machine": machine(),
        "command": "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        "runs": runs,
        "quick": args.quick,
        "backends": backends,
        "fdb": "fdb" in with_fdb,
        "started": stamp,
        "durations_s": {},
        # The machine may be shared with other work: the load average is recorded around
        # every section so a reader can judge the wall-clock numbers.
        "loadavg": {},
    }
    results: dict[str, Any] = {}
    t_all = time.time()
    for name in sections:
        t0 = time.time()
        load_before = os.getloadavg()
        log(f"section {name} (load average {load_before[0]:.1f})")
        if name == "core":
            from bench import core_throughput

            results[name] = core_throughput.run(with_fdb, runs, args.quick)
        elif name == "scale":
            from bench import core_scale

            results[name] = core_scale.run(backends, args.quick)
        elif name == "paper":
            from bench import paper

            results[name] = paper.run(with_fdb, runs, args.quick)
        elif name == "peers":
            from bench import peers_run

            results[name] = peers_run.run(runs, args.quick, backends)
        elif name == "fdb":
            if "fdb" not in with_fdb:
                continue
            from bench import fdb_engine

            results[name] = fdb_engine.run(runs, args.quick, out)
        meta["durations_s"][name] = round(time.time() - t0, 1)
        meta["loadavg"][name] = [round(load_before[0], 1), round(os.getloadavg()[0], 1)]
        (out / f"{name}.json").write_text(json.dumps(results[name], indent=1, default=str))
    meta["durations_s"]["total"] = round(time.time() - t_all, 1)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return _report(out, args.publish)


def _report(out: Path, publish: bool) -> int:
    from bench import report

    meta = json.loads((out / "meta.json").read_text())
    results = {
        name: json.loads((out / f"{name}.json").read_text())
        for name in SECTIONS
        if (out / f"{name}.json").exists()
    }
    text = report.write(out, meta, results)
    if not publish:
        log(f"report: {out / 'report.md'}")
        return 0
    (ROOT / "REPORT.md").write_text(
        re.sub(r"\]\(([\w.]+\.png)\)", rf"](results/{out.name}/\1)", text)
    )
    log(f"report: {out / 'report.md'} (copied to bench/REPORT.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

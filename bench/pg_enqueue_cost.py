"""What one enqueue costs on PostgreSQL, this checkout beside another (issue 42's costs of
layout 3): a plain INSERT transaction, ``Quick.enqueue`` (autocommit), ``enqueue_on``
inside a transaction that INSERTs a row and commits at once (W=0), ``enqueue_on`` in a
transaction held open ``--hold-ms`` (the store's status queries about it while it is
open), and ``run_until_idle`` draining what was enqueued.

``python -m bench.pg_enqueue_cost [--n 1000] [--runs 3] [--baseline DIR] [--dsn URL]
[--json FILE]``

One PostgreSQL cluster (:func:`bench.servers.postgres_server`, fsync on; or the server
``--dsn`` names: each measurement drops the schema and table it made) serves every run.
Each run measures this checkout and, with ``--baseline DIR`` (another checkout with its
own ``.venv``: ``git worktree add DIR main``), that one, each in a process of its own
(its ``.venv``'s Python, so it imports its own quickzones) on a schema of its own, their
order alternating run by run so a noisy stretch of the shared host falls on both. Per
operation: wall ms and process CPU ms (every thread: the store's own threads included),
per call; medians over ``--runs``, and this checkout's figure over the baseline's.
Warm-up: every tenant's zone has its pointer before the loops (the steady state).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

OPERATIONS = ("plain", "enqueue", "enqueue_on", "drain")


def _child(dsn: str, n: int, tenants: int, hold_ms: int) -> dict[str, Any]:
    """Measured in this process: the quickzones it imports is the checkout's."""
    import random

    import psycopg

    from quickzones.client import Quick

    schema = "cost_" + uuid.uuid4().hex[:10]
    q = Quick.open(f"{dsn}?schema={schema}")

    @q.job("j")
    def job(payload: Any, ctx: Any) -> None:
        return None

    conn = psycopg.connect(dsn)
    conn.execute(f"CREATE TABLE {schema}_orders (id serial PRIMARY KEY, v int)")
    conn.commit()
    rng = random.Random(1)
    for t in range(tenants):
        q.enqueue("j", {"warm": t}, app="a", tenant=f"t{t}")
    q.run_until_idle()

    def plain() -> None:
        for i in range(n):
            conn.execute(f"INSERT INTO {schema}_orders (v) VALUES (%s)", (i,))
            conn.commit()

    def enqueue() -> None:
        for i in range(n):
            q.enqueue("j", {"i": i}, app="a", tenant=f"t{rng.randrange(tenants)}")

    def enqueue_on() -> None:
        for i in range(n):
            conn.execute(f"INSERT INTO {schema}_orders (v) VALUES (%s)", (i,))
            q.enqueue_on(conn, "j", {"i": i}, app="a", tenant=f"t{rng.randrange(tenants)}")
            conn.commit()

    def drain() -> None:
        q.run_until_idle()

    after = q.kv.after_commit  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    for name, body in (
        ("plain", plain),
        ("enqueue", enqueue),
        ("enqueue_on", enqueue_on),
        ("drain", drain),
    ):
        wall, cpu = time.perf_counter(), time.process_time()
        body()
        if name == "enqueue_on":
            while after.pending:  # part two of each, on the store's thread
                time.sleep(0.001)
        per = 2 * n if name == "drain" else n  # drain: every item of both enqueue loops
        out[name] = {
            "wall_ms": (time.perf_counter() - wall) * 1000 / per,
            "cpu_ms": (time.process_time() - cpu) * 1000 / per,
        }
    # An application's transaction held open: the store's status queries meanwhile.
    asks = getattr(after, "asks", None)
    conn.execute(f"INSERT INTO {schema}_orders (v) VALUES (0)")
    q.enqueue_on(conn, "j", {"held": 1}, app="a", tenant="t0")
    cpu = time.process_time()
    time.sleep(hold_ms / 1000)
    out["held_open"] = {
        "cpu_ms": (time.process_time() - cpu) * 1000,
        "asks": None if asks is None else after.asks - asks,
    }
    conn.commit()
    q.close()
    conn.close()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.execute(f"DROP TABLE {schema}_orders")
    return out


def _measure(tree: Path, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), __file__, "--child", dsn]
    cmd += ["--n", str(args.n), "--tenants", str(args.tenants), "--hold-ms", str(args.hold_ms)]
    done = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], op: str, what: str) -> float:
    return statistics.median(r[op][what] for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1000, help="calls of each operation per run")
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--hold-ms", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", default="", help="another checkout with its own .venv")
    ap.add_argument("--dsn", default="", help="a server to use instead of starting one")
    ap.add_argument("--json", default="", help="write the results to this file")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.n, args.tenants, args.hold_ms)))
        return 0
    from bench.common import REPO, log, machine
    from bench.servers import postgres_server

    trees = {"this": Path(REPO)}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with contextlib.ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(postgres_server())
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(reversed(trees))
            for name in order:
                log(f"run {run + 1}/{args.runs}: {name} (load {os.getloadavg()[0]:.1f})")
                runs[name].append(_measure(trees[name], dsn, args))
    lines = []
    for op in OPERATIONS:
        for what in ("wall_ms", "cpu_ms"):
            row = {name: _median(runs[name], op, what) for name in trees}
            text = "  ".join(f"{name} {value:.3f}" for name, value in row.items())
            if "baseline" in row:
                text += f"  ratio {row['this'] / row['baseline']:.2f}"
            lines.append(f"{op:10s} {what:7s} {text}")
    for name in trees:
        held = [r["held_open"] for r in runs[name]]
        asks = [h["asks"] for h in held if h["asks"] is not None]
        lines.append(
            f"held open {args.hold_ms} ms, {name}: cpu "
            f"{statistics.median(h['cpu_ms'] for h in held):.1f} ms"
            + (f", status queries {statistics.median(asks):.0f}" if asks else "")
        )
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": machine(), "args": vars(args), "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

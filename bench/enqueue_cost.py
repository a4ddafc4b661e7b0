"""What one enqueue costs, this checkout beside another, on SQLite or PostgreSQL (issue 42's
costs of layout 3, issue 44 point 1): a plain INSERT transaction, ``Quick.enqueue``
(autocommit), ``enqueue_on`` inside a transaction that INSERTs a row and commits at once
(W=0), ``enqueue_on`` in a transaction held open ``--hold-ms`` (the store's own work while
it is open), and ``run_until_idle`` draining what was enqueued. ``enqueue_pull``:
``Quick.enqueue`` into a zone whose idle pointer vests later than the new item (a zone that
emptied, its pointer waiting for collection, or holding only delayed items: a small
tenant's usual enqueue), so part two must pull the pointer earlier; each call a zone of its
own, set up beforehand with an item an hour out. ``enqueue_paused``: ``Quick.enqueue``
made ``--pause-s`` after the last call (1.1 s: past the steady clock's one-second floor
exchange, within the 2 s that PostgreSQL's known reads stay fresh), ``--paused`` calls: a
web application's enqueue, one now and then; its wall time per call, pauses not counted.

``python -m bench.enqueue_cost [--store sqlite|postgres] [--n 1000] [--runs 5]
[--paused 10] [--pause-s 1.1] [--baseline DIR] [--dsn URL] [--json FILE]``

``--store postgres`` (``python -m bench.pg_enqueue_cost`` is this): one PostgreSQL
cluster (:func:`bench.servers.postgres_server`, fsync on; or the server ``--dsn`` names:
each measurement drops the schema and table it made) serves every run. ``--store sqlite``
(the default): each measurement a new file in a temporary folder, removed after; the
application's table is in that file and its connection runs at the store's default
``synchronous=NORMAL``, as quick's own connections do.

Each run measures this checkout and, with ``--baseline DIR`` (another checkout with its
own ``.venv``: ``git worktree add DIR main``), that one, each in a process of its own
(its ``.venv``'s Python, so it imports its own quickzones) on a store of its own, their
order alternating run by run so a noisy stretch of the shared host falls on both. Per
operation: wall ms and process CPU ms (every thread: the store's own threads included),
per call; for the two enqueue loops also the median of each call's own CPU
(``time.process_time`` around the call: a checkpoint or a pause of the host lands on a few
calls, not on the median). Medians over ``--runs``, and this checkout's figure over the
baseline's. Warm-up: every tenant's zone has its pointer before the loops (the steady
state).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

OPERATIONS = ("plain", "enqueue", "enqueue_pull", "enqueue_on", "drain", "enqueue_paused")
STORES = ("sqlite", "postgres")


@contextlib.contextmanager
def _sqlite_app(url: str) -> Iterator[tuple[Any, str, Callable[[], None]]]:
    """A new store file and the application's own connection to it (its table ``orders``)."""
    import sqlite3

    folder = tempfile.mkdtemp(prefix="enqueue-cost-")
    path = os.path.join(folder, "cost.db")
    try:
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # the store's own default
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, v INTEGER)")
        conn.commit()
        try:
            yield conn, f"sqlite:///{path}", lambda: None
        finally:
            conn.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _postgres_app(dsn: str) -> Iterator[tuple[Any, str, Callable[[], None]]]:
    """A schema of its own and the application's own connection (its table
    ``<schema>_orders``), both dropped after."""
    import psycopg

    schema = "cost_" + uuid.uuid4().hex[:10]
    conn = psycopg.connect(dsn)
    conn.execute(f"CREATE TABLE {schema}_orders (id serial PRIMARY KEY, v int)")
    conn.commit()

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.execute(f"DROP TABLE {schema}_orders")

    try:
        yield conn, f"{dsn}?schema={schema}", drop
    finally:
        conn.close()


def _child(
    store: str, dsn: str, n: int, tenants: int, hold_ms: int, paused: int, pause_s: float
) -> dict[str, Any]:
    """Measured in this process: the quickzones it imports is the checkout's."""
    import random

    from quickzones.client import Quick

    app = _sqlite_app(dsn) if store == "sqlite" else _postgres_app(dsn)
    with app as (conn, url, drop):
        table = "orders" if store == "sqlite" else url.rsplit("=", 1)[1] + "_orders"
        insert = f"INSERT INTO {table} (v) VALUES ({'?' if store == 'sqlite' else '%s'})"
        q = Quick.open(url)

        @q.job("j")
        def job(payload: Any, ctx: Any) -> None:
            return None

        rng = random.Random(1)
        for t in range(tenants):
            q.enqueue("j", {"warm": t}, app="a", tenant=f"t{t}")
        q.run_until_idle()
        per_call: dict[str, list[float]] = {"enqueue": [], "enqueue_pull": [], "enqueue_on": []}
        for i in range(n):  # enqueue_pull's zones: each pointer vesting an hour out
            q.enqueue("j", {"later": i}, app="a", tenant=f"p{i}", delay=3600)
        cpu = time.process_time

        def plain() -> None:
            for i in range(n):
                conn.execute(insert, (i,))
                conn.commit()

        def enqueue() -> None:
            took = per_call["enqueue"]
            for i in range(n):
                tenant = f"t{rng.randrange(tenants)}"
                c = cpu()
                q.enqueue("j", {"i": i}, app="a", tenant=tenant)
                took.append(cpu() - c)

        def enqueue_pull() -> None:
            took = per_call["enqueue_pull"]
            for i in range(n):
                c = cpu()
                q.enqueue("j", {"i": i}, app="a", tenant=f"p{i}")
                took.append(cpu() - c)

        def enqueue_on() -> None:
            took = per_call["enqueue_on"]
            for i in range(n):
                conn.execute(insert, (i,))
                tenant = f"t{rng.randrange(tenants)}"
                c = cpu()
                q.enqueue_on(conn, "j", {"i": i}, app="a", tenant=tenant)
                took.append(cpu() - c)
                conn.commit()

        def drain() -> None:
            q.run_until_idle()

        after = getattr(q.kv, "after_commit", None)  # PostgreSQL's part-two thread
        out: dict[str, Any] = {}
        for name, body in (
            ("plain", plain),
            ("enqueue", enqueue),
            ("enqueue_pull", enqueue_pull),
            ("enqueue_on", enqueue_on),
            ("drain", drain),
        ):
            wall, started = time.perf_counter(), cpu()
            body()
            if name == "enqueue_on" and after is not None:
                while after.pending:  # part two of each, on the store's thread
                    time.sleep(0.001)
            per = 3 * n if name == "drain" else n  # drain: every vested item of the loops
            out[name] = {
                "wall_ms": (time.perf_counter() - wall) * 1000 / per,
                "cpu_ms": (cpu() - started) * 1000 / per,
            }
            if name in per_call:
                out[name]["cpu_p50_ms"] = statistics.median(per_call[name]) * 1000
        if paused:
            walls, cpus = [], []
            for i in range(paused):
                time.sleep(pause_s)
                tenant = f"t{rng.randrange(tenants)}"
                wall, c = time.perf_counter(), cpu()
                q.enqueue("j", {"paused": i}, app="a", tenant=tenant)
                walls.append(time.perf_counter() - wall)
                cpus.append(cpu() - c)
            out["enqueue_paused"] = {
                "wall_ms": statistics.mean(walls) * 1000,
                "wall_p50_ms": statistics.median(walls) * 1000,
                "cpu_ms": statistics.mean(cpus) * 1000,
                "cpu_p50_ms": statistics.median(cpus) * 1000,
            }
        # An application's transaction held open: the store's own work meanwhile.
        asks = getattr(after, "asks", None)
        conn.execute(insert, (0,))
        q.enqueue_on(conn, "j", {"held": 1}, app="a", tenant="t0")
        started = cpu()
        time.sleep(hold_ms / 1000)
        out["held_open"] = {
            "cpu_ms": (cpu() - started) * 1000,
            "asks": None if asks is None or after is None else after.asks - asks,
        }
        conn.commit()
        q.close()
        drop()
    return out


def _measure(tree: Path, store: str, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    python = tree / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), __file__, "--child", dsn]
    cmd += ["--store", store, "--n", str(args.n), "--tenants", str(args.tenants)]
    cmd += ["--hold-ms", str(args.hold_ms)]
    cmd += ["--paused", str(args.paused), "--pause-s", str(args.pause_s)]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:  # the child's own words, not only its exit status
        raise RuntimeError(
            f"measuring {tree} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], op: str, what: str) -> float | None:
    values = [r[op][what] for r in runs if what in r.get(op, {})]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--store", choices=STORES, default="sqlite")
    ap.add_argument("--n", type=int, default=1000, help="calls of each operation per run")
    ap.add_argument("--tenants", type=int, default=50)
    ap.add_argument("--hold-ms", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--paused", type=int, default=10, help="enqueue_paused's calls per run")
    ap.add_argument("--pause-s", type=float, default=1.1, help="the pause before each")
    ap.add_argument("--baseline", default="", help="another checkout with its own .venv")
    ap.add_argument("--dsn", default="", help="a PostgreSQL server to use instead of one's own")
    ap.add_argument("--json", default="", help="write the results to this file")
    args = ap.parse_args(argv)
    if args.child:
        out = _child(
            args.store, args.child, args.n, args.tenants, args.hold_ms, args.paused, args.pause_s
        )
        print(json.dumps(out))
        return 0
    from bench.common import REPO, log, machine
    from bench.servers import postgres_server

    trees = {"this": Path(REPO)}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    loads: list[float] = []
    with contextlib.ExitStack() as stack:
        if args.store == "sqlite":
            dsn = "sqlite"  # each measurement makes its own file
        else:
            dsn = args.dsn or stack.enter_context(postgres_server())
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(reversed(trees))
            for name in order:
                loads.append(os.getloadavg()[0])
                log(f"run {run + 1}/{args.runs}: {name} (load {loads[-1]:.1f})")
                runs[name].append(_measure(trees[name], args.store, dsn, args))
    lines = [f"{args.store}, {args.runs} runs of {args.n} calls"]
    lines[0] += f", load average {min(loads):.1f}-{max(loads):.1f}"
    for op in OPERATIONS:
        for what in ("wall_ms", "wall_p50_ms", "cpu_ms", "cpu_p50_ms"):
            row = {name: _median(runs[name], op, what) for name in trees}
            if None in row.values():
                continue
            text = "  ".join(f"{name} {value:.3f}" for name, value in row.items())
            this, baseline = row["this"], row.get("baseline")
            if this is not None and baseline:
                text += f"  ratio {this / baseline:.2f}"
            lines.append(f"{op:10s} {what:10s} {text}")
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
            json.dumps(
                {"machine": machine(), "args": vars(args), "loads": loads, "runs": runs},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

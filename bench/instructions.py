"""What one enqueue and one drained item cost in machine instructions, counted by
valgrind's callgrind: an A/B of two trees that the host's load does not move.

``python -m bench.instructions [--n 400] [--runs 1] [--ops enqueue,drain]
[--store sqlite|postgres] [--dsn URL] [--baseline PYTHON] [--out DIR]``

The shared VMs move a process's speed by a quarter from one process to the next (the
same drain cost 2.45 or 3.1 s of CPU, `docs/performance.md`), so a change that saves 5 %
of an enqueue's CPU cannot be told from noise by timing it. Instructions can: each op is
counted as the difference between two runs of a child process under callgrind, one doing
``--n`` of it after the same set-up and one doing none, divided by ``--n``
(``PYTHONHASHSEED=0`` in both; random ids still move a count by about 2 %, the bench's
floor). Ops, each on a fresh store in the child (a SQLite file; with ``--store postgres``
a schema of its own on the server ``--dsn`` names, or on a private one the bench starts,
where only the client's instructions are counted: the server's are another process's):

- ``enqueue``: one ``Quick.enqueue`` call a job into one tenant (its pointer vesting in
  time), after 300 such calls;
- ``drain``: ``--n`` items enqueued one call each, then drained by
  ``Consumer.run_until_idle`` with ``ConsumerConfig(workers=4)`` (``quick worker
  --workers 4``'s visits of 4 items), against the same enqueues with no drain.

``--baseline`` names another checkout's interpreter (a worktree with its own virtualenv):
the child is this file run by that interpreter, so it uses only the public API both trees
have. Needs valgrind (Debian's ``valgrind``); each count runs the interpreter about 50
times slower, so ``--n 400`` takes about a minute an op and tree.

Results: ``bench/results/<UTC timestamp>-instructions/instructions.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

OPS = ("enqueue", "drain")
WARM_ENQUEUES = 300
PAYLOAD = {"t": "x", "e": 1.5, "d": 1.5, "w": 0.0}  # bench.peers' quick payload's shape
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")

# Given (python, op, n, drain, dsn), the instructions the child ran.
Counter = Callable[[str, str, int, bool, str], int]


def child(op: str, n: int, drain: bool, dsn: str = "sqlite") -> int:
    """One child's work, in this process: the set-up, then ``n`` of ``op``, on a fresh
    SQLite file (``dsn`` "sqlite") or a fresh schema of the PostgreSQL server ``dsn``,
    dropped after. Returns the items the drain ran (0 without a drain)."""
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    with tempfile.TemporaryDirectory(prefix="quick-instructions-") as folder:
        schema = f"instructions_{os.getpid()}"
        if dsn == "sqlite":
            url = f"sqlite:///{os.path.join(folder, 'x.db')}"
        else:
            url = f"{dsn}?schema={schema}"
        q = Quick.open(url)
        try:
            q.job("bench.noop")(lambda payload, ctx: None)
            warm = WARM_ENQUEUES if op == "enqueue" else 0
            for _ in range(warm + n):
                q.enqueue("bench.noop", PAYLOAD, app="b", tenant="t0")
            if not drain:
                return 0
            return int(q.consumer(ConsumerConfig(workers=4, seed=1)).run_until_idle())
        finally:
            q.close()
            if dsn != "sqlite":
                _drop_schema(dsn, schema)


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def parse_collected(stderr: str) -> int:
    """The instruction count callgrind printed (``==pid== Collected : N``)."""
    found = _COLLECTED.findall(stderr)
    if not found:
        raise RuntimeError(f"no instruction count in callgrind's output: {stderr[-500:]!r}")
    return int(found[-1])


def callgrind_count(python: str, op: str, n: int, drain: bool, dsn: str = "sqlite") -> int:
    """Instructions of one child run under callgrind (its profile thrown away)."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        python,
        os.path.abspath(__file__),
        "--child",
        op,
        str(n),
        "1" if drain else "0",
        dsn,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-800:]}")
    return parse_collected(done.stderr)


def per_op(count: Counter, python: str, op: str, n: int, dsn: str = "sqlite") -> float:
    """Instructions one ``op`` costs: a run doing ``n`` of it less one doing none (for the
    drain: the same enqueues, drained or not)."""
    if op == "enqueue":
        base, full = count(python, op, 0, False, dsn), count(python, op, n, False, dsn)
    elif op == "drain":
        base, full = count(python, op, n, False, dsn), count(python, op, n, True, dsn)
    else:
        raise ValueError(f"unknown op {op!r}: one of {', '.join(OPS)}")
    return (full - base) / n


def measure(
    trees: dict[str, str], ops: list[str], n: int, runs: int, count: Counter, dsn: str = "sqlite"
) -> dict[str, dict[str, list[float]]]:
    """Per tree and op, the instructions an op of each run; trees alternate which goes
    first from run to run."""
    out: dict[str, dict[str, list[float]]] = {name: {op: [] for op in ops} for name in trees}
    for i in range(runs):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for op in ops:
            for name in order:
                out[name][op].append(per_op(count, trees[name], op, n, dsn))
    return out


def main(argv: list[str] | None = None, count: Counter = callgrind_count) -> int:
    """The bench; ``count`` counts one child's instructions (tests pass a fake)."""
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--child"]:
        _, op, n, drain, dsn = args_in
        ran = child(op, int(n), drain == "1", dsn)
        if drain == "1" and ran != int(n):
            raise SystemExit(f"the drain ran {ran} of {n} items")
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    ap.add_argument("--n", type=int, default=400, help="ops counted a run")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--ops", default=",".join(OPS), help=f"among {','.join(OPS)}")
    ap.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--dsn", default="", help="a PostgreSQL server (default: a private one)")
    ap.add_argument("--baseline", default="", help="another tree's python (its virtualenv)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(args_in)
    ops = [op for op in args.ops.split(",") if op]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        ap.error(f"unknown --ops {', '.join(unknown)}: among {', '.join(OPS)}")
    if args.n < 1 or args.runs < 1:
        ap.error("--n and --runs must be at least 1")
    if count is callgrind_count and shutil.which("valgrind") is None:
        ap.error("valgrind is not installed (apt-get install valgrind)")
    from bench.common import log, summary, write_run
    from bench.servers import postgres_server

    trees = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    with contextlib.ExitStack() as stack:
        dsn = "sqlite"
        if args.store == "postgres":
            dsn = args.dsn or stack.enter_context(postgres_server())
        counts = measure(trees, ops, args.n, args.runs, count, dsn)
    medians = {
        name: {op: summary(values)["median"] for op, values in by_op.items()}
        for name, by_op in counts.items()
    }
    for op in ops:
        line = ", ".join(f"{name} {medians[name][op] / 1e3:.1f} K" for name in trees)
        if "baseline" in trees and medians["baseline"][op]:
            line += f" (this/baseline {medians['this'][op] / medians['baseline'][op]:.3f})"
        log(f"{op}: instructions an op, medians of {args.runs}: {line}")
    out = write_run(
        "instructions",
        args.out,
        "python -m bench.instructions " + " ".join(args_in),
        {"n": args.n, "store": args.store, "runs": counts, "median_instructions": medians},
    )
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

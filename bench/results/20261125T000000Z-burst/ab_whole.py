"""Interleaved A/B of two whole trees on workload (ii): producer and consumer both run
tree A's or tree B's code (``bench.noisy_pickup --runs 1 --no-huey`` under each tree's
interpreter, from its checkout), alternately, ``pairs`` times. For changes on the
producer's side (the enqueue), which ``../20261124T175500Z-visit-cpu/ab_trees.py`` (one
producer, two consumers) cannot compare.

    python ab_whole.py TREE_A PYTHON_A TREE_B PYTHON_B PAIRS OUT.jsonl
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one(tree: str, python: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PATH": f"{Path(python).parent}:{os.environ['PATH']}"}
        cmd = [python, "-m", "bench.noisy_pickup", "--runs", "1", "--no-huey", "--out", out]
        subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
        run = json.loads((Path(out) / "noisy_pickup.json").read_text())["per_run"]["quick-sqlite"]
        return {k: round(v, 2) for k, v in run[0].items()}


def main() -> None:
    tree_a, py_a, tree_b, py_b, pairs, dest = sys.argv[1:7]
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    sides = [("A", tree_a, py_a), ("B", tree_b, py_b)]
    with open(dest, "a") as f:
        for i in range(int(pairs)):
            for name, tree, py in sides if i % 2 == 0 else sides[::-1]:
                res = one(tree, py)
                runs[name].append(res)
                line = json.dumps({"run": name, **res})
                print(line, flush=True)
                f.write(line + "\n")
        for name, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            line = json.dumps({"median": name, "n": len(rs), **med})
            print(line, flush=True)
            f.write(line + "\n")
        wins = sum(
            b["small_p99"] < a["small_p99"] for a, b in zip(runs["A"], runs["B"], strict=True)
        )
        print(f"B's small p99 lower in {wins} of {len(runs['A'])} pairs", flush=True)
        f.write(json.dumps({"b_better_pairs": wins, "pairs": len(runs["A"])}) + "\n")


if __name__ == "__main__":
    main()

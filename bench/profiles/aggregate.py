"""Summarise a ``py-spy record --format raw`` file: inclusive and self share per function.

    py-spy record --gil -r 500 --format raw -o prof.txt -- python script.py
    python bench/profiles/aggregate.py prof.txt 60

``--gil`` samples only the thread holding the GIL, which is the right view of a
GIL-bound process: the shares add up to where the one usable core goes.
"""

from __future__ import annotations

import sys
from collections import Counter


def _name(frame: str) -> str:
    if " (" not in frame:
        return frame
    func, rest = frame.split(" (", 1)
    return f"{func} ({rest.split(':')[0].split('/')[-1]})"


def main(path: str, top: int = 40) -> None:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, count = line.rstrip().rsplit(" ", 1)
            n = int(count)
            total += n
            frames = [_name(x) for x in stack.split(";")]
            own[frames[-1]] += n
            for name in set(frames):
                inclusive[name] += n
    print("total samples", total)
    for k, v in inclusive.most_common(top):
        print(f"{v / total:6.1%} {k}")
    print("--- self")
    for k, v in own.most_common(20):
        print(f"{v / total:6.1%} {k}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)

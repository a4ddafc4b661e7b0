"""Summarise a ``py-spy record --idle --threads --format raw`` file per thread: where each
thread's samples end (its last three frames), so a thread that is busy shows what it
waits on, and an idle one shows its queue.

    python -m bench.profiles.fdb_e2e OUT --spy all   # writes OUT/consumer_all.txt
    python bench/profiles/threads.py OUT/consumer_all.txt 6
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict


def main(path: str, top: int = 8) -> None:
    per: defaultdict[str, Counter[str]] = defaultdict(Counter)
    total: Counter[str] = Counter()
    with open(path) as f:
        for line in f:
            stack, count = line.rstrip().rsplit(" ", 1)
            n = int(count)
            frames = stack.split(";")
            thread = re.sub(r"thread \(\d+\): ", "", frames[0])
            thread = re.sub(r"[-_]?\d+$", "", thread)  # pool threads share one name
            leaf = " <- ".join(re.sub(r" \(.*/", " (", f) for f in frames[-3:])
            per[thread][leaf] += n
            total[thread] += n
    for thread, n in total.most_common():
        print(f"== {thread} ({n} samples)")
        for leaf, k in per[thread].most_common(top):
            print(f"  {k / n:6.1%} {leaf}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)

#!/usr/bin/env bash
# Per-thread CPU (cores a process, by thread name) of `quick worker --processes N`'s children over
# a window of bench.scaling's noop run, for N in DIAG_COUNTS (default "1 8"): each Python process
# started with DIAG_DIR set dumps its threads' CPU (thread_cpu/sitecustomize.py). On the 16-core
# machine: bash .dev/run.sh bash scripts/ab16/thread_cpu.sh (results and the sums in $OUT/tN/).
for n in ${DIAG_COUNTS:-1 8}; do
  d=$OUT/t$n; mkdir -p $d
  PYTHONPATH=$PWD/scripts/ab16/thread_cpu:$PYTHONPATH DIAG_DIR=$d python3 -m bench.scaling --processes $n --workloads noop --seconds 8 --warm 2 2>&1 | grep -E "items/s|items in"
done
python3 - <<'PY'
import json, os, glob, collections, re
for d in sorted(glob.glob(os.environ["OUT"] + "/t*")):
    agg = collections.Counter(); procs = 0
    for f in glob.glob(d + "/*.json"):
        j = json.load(open(f))
        if not any("worker" == a for a in j["argv"]) and "spawn_main" not in " ".join(j["argv"]) and "-c" not in j["argv"]:
            continue
        c = j["cores"]; tot = sum(c.values())
        if tot < 0.05: continue
        procs += 1
        for k, v in c.items():
            agg[re.sub(r"[-_ ]?\d+$", "", k.split("|")[0])] += v
    print(d, "busy processes", procs)
    for k, v in agg.most_common(14): print(f"  {k:40s} {v/ max(procs,1):.3f} cores a process")
PY

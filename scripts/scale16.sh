#!/usr/bin/env bash
# Issue 29's measurements on the 16-core machine, in one run of at most 8 minutes: items/s,
# the ratio to one process and the share of lost pointer leases for 1, 2, 4 and 8 consumer
# processes (quick worker --processes N), no-op items with ConsumerConfig() defaults and the
# paper's experiment (a) (50 ms items, 64 workers a consumer), on the FoundationDB cluster
# that .dev/run.sh starts (../shared/scale16/README.md):
#
#   bash scripts/scale16-pack                       # here, before each run: writes .dev/
#   bash .dev/run.sh bash scripts/scale16.sh        # there; results in $OUT/
#
# Writes to $OUT (default ./scale16-out): machine.txt, scaling.json and scaling.md
# (rewritten after each measurement, so a run cut short keeps what it measured),
# scaling.log, and exit.txt (bench.scaling's status: 1 when a run drained its backlog).
# Smaller, for a try on a 2-core machine:
#   FDB_PROCS=1 PROCESSES=1,2 SCALE_SECONDS=3 bash .dev/run.sh bash scripts/scale16.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/scale16-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PROCESSES=${PROCESSES:-1,2,4,8}
WORKLOADS=${WORKLOADS:-noop,sleep50}
SCALE_SECONDS=${SCALE_SECONDS:-8}
LIMIT_S=${LIMIT_S:-450}  # bench.scaling's own limit: 8 minutes less the cluster's start
{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores: $(nproc)"
  lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\))" || true
  echo "python: $($PY --version 2>&1)"
  echo "fdb cluster file: ${FDB_CLUSTER_FILE:-none} (${FDB_PROCS:-7} fdbserver processes)"
  # The wheel's commit (scripts/scale16-pack); a device's copy of .git may be stale.
  echo "commit: $(cat .dev/commit.txt 2>/dev/null || echo "unknown ($(git rev-parse HEAD 2>/dev/null) by .git)")"
  echo "processes: $PROCESSES; workloads: $WORKLOADS; window: ${SCALE_SECONDS}s; limit: ${LIMIT_S}s"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
timeout --signal=TERM --kill-after=20 "$LIMIT_S" \
  "$PY" -m bench.scaling --processes "$PROCESSES" --workloads "$WORKLOADS" \
  --seconds "$SCALE_SECONDS" --warm 2 --out "$OUT" 2>&1 | tee "$OUT/scaling.log"
status=${PIPESTATUS[0]}
echo "$status" > "$OUT/exit.txt"
[ -f "$OUT/scaling.md" ] && cat "$OUT/scaling.md"
exit "$status"

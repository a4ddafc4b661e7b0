#!/usr/bin/env bash
# Issue 44 point 7 on the 16-core machine, one run: no-op items with `quick worker`
# defaults at 1, 2, 4 and 8 consumer processes (x7 at 8 wanted, lost pointer leases at most
# 5 %); then, as time is left: the raw FoundationDB client at 1 and 8 processes
# (scripts/ab16/client_scaling.py: what the machine and cluster allow), each consumer
# thread's CPU at 8 processes (scripts/ab16/thread_cpu.sh), noop at 1 and 8 again as a
# second sitting, and the paper's experiment (a) at 1 and 8. Each bench part is
# scripts/scale16.sh with its own folder; everything ends up in $OUT/results.tgz (the
# device returns at most 8 files) and the tables on stdout. Takes about 5 minutes.
#
#   bash scripts/scale16-pack                               # here: writes .dev/
#   bash .dev/run.sh bash scripts/scale16-issue44.sh        # there
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/scale16-out}
mkdir -p "$OUT"
started=$(date +%s)
left() { echo $(( ${BUDGET_S:-480} - ($(date +%s) - started) )); }
part() {  # name limit_s processes workloads
  local l; l=$(left)
  [ "$l" -gt 60 ] || { echo "== skip $1: ${l}s left"; return; }
  [ "$2" -lt "$l" ] || set -- "$1" "$((l - 10))" "$3" "$4"
  echo "== $1: processes $3, $4, limit $2 s"
  OUT="$OUT/$1" LIMIT_S="$2" PROCESSES="$3" WORKLOADS="$4" bash scripts/scale16.sh >/dev/null 2>&1
  cat "$OUT/$1/scaling.md" 2>/dev/null; tail -3 "$OUT/$1/scaling.log" 2>/dev/null
}
part noop-1248 "${LIMIT_A:-230}" "${PROCESSES_A:-1,2,4,8}" noop
if [ "$(left)" -gt 60 ]; then
  echo "== client-scaling: the raw FoundationDB client, 1 and 8 processes"
  mkdir -p "$OUT/client"
  timeout 50 python3 scripts/ab16/client_scaling.py "${CLIENT_AT:-1,8}" 2>&1 | tee "$OUT/client/client.txt"
fi
if [ "$(left)" -gt 80 ]; then
  echo "== thread-cpu: each consumer thread's CPU at 8 processes"
  OUT="$OUT/threads" DIAG_COUNTS="${THREADS_AT:-8}" timeout 70 bash scripts/ab16/thread_cpu.sh 2>&1 | tee "$OUT/threads.txt"
fi
part noop-18 "${LIMIT_B:-140}" "${PROCESSES_B:-1,8}" noop
part sleep50-18 "${LIMIT_C:-100}" "${PROCESSES_C:-1,8}" sleep50
tar -C "$OUT" -czf /tmp/scale16-results.tgz . && mv /tmp/scale16-results.tgz "$OUT/results.tgz" \
  && echo "== $OUT/results.tgz"

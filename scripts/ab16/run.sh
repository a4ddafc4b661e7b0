#!/usr/bin/env bash
# A/B of consumer defaults on the 16-core machine: each variant wheel (.dev/var/NAME: main with
# one default changed) runs bench.noisy_pickup and bench.lone_tenant (quick worker --workers 4
# as the README starts it; Huey beside variant A) in streams pinned to 2 cores each, the
# variants in a fresh random order every round, for DUR seconds; one more stream runs
# bench.scaling --processes 1,2 on a one-process FoundationDB pinned to 2 cores.
set -u
root=$PWD; O=${OUT:-/tmp/out}; mkdir -p "$O"
DUR=${DUR:-400}
VARS=${VARS:-$(ls .dev/var)}
STREAMS=${STREAMS:-"2,3 4,5 6,7 8,9 10,11 12,13"}
FDBCORES=${FDBCORES-14,15}  # empty: no FoundationDB stream
nproc > "$O/nproc.txt"; date -u > "$O/start.txt"; echo "$VARS" > "$O/vars.txt"
for v in $VARS; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-$v .dev/var/$v/*.whl .dev/whl/croniter*.whl .dev/whl/huey*.whl .dev/whl/foundationdb*.whl 2>/dev/null
done
stream() {
  local cores=$1 s=$2 r=0 end=$(( $(date +%s) + DUR ))
  while [ "$(date +%s)" -lt $end ]; do
    r=$((r + 1))
    for v in $(printf '%s\n' $VARS | shuf); do
      [ "$(date +%s)" -ge $end ] && break
      P=/tmp/site-$v:$root; huey=--no-huey; [ "$v" = A ] && huey=
      PYTHONPATH=$P timeout 40 taskset -c "$cores" python3 -m bench.noisy_pickup --runs 1 --no-huey --no-profile --workers 4 --out "$O/n-$v-$s-$r" >> "$O/log-$s.txt" 2>&1
      PYTHONPATH=$P timeout 40 taskset -c "$cores" python3 -m bench.lone_tenant --runs 1 $huey --backends sqlite --sizes user --out "$O/l-$v-$s-$r" >> "$O/log-$s.txt" 2>&1
    done
  done
}
i=0
for c in $STREAMS; do i=$((i + 1)); stream "$c" "$i" & done
if [ -n "$FDBCORES" ]; then
  ( end=$(( $(date +%s) + DUR - 100 )); r=0
    while [ "$(date +%s)" -lt $end ]; do r=$((r + 1))
      OUT= FDB_PROCS=1 timeout 120 taskset -c "$FDBCORES" bash .dev/run.sh python3 -m bench.scaling --processes 1,2 --workloads noop --seconds 6 --warm 2 --tenants 300 --out "$O/fdb-$r" >> "$O/log-fdb.txt" 2>&1
    done ) &
fi
wait
date -u > "$O/end.txt"
python3 scripts/ab16/summary.py "$O" | tee "$O/summary.md"

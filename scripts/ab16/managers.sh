#!/usr/bin/env bash
# Issue 29 on the 16-core machine: no-op items at 1 and 8 consumer processes with 4, 8 and 16
# managers a process (bench/results/README.md#20261126t213725z-scale16). Results in $OUT/mM/.
#   bash .dev/run.sh bash scripts/ab16/managers.sh
set -u; OUT=${OUT:-$PWD/managers-out}
for m in 4 8 16; do
  mkdir -p $OUT/m$m
  timeout 120 python3 -m bench.scaling --processes 1,8 --workloads noop --seconds 8 --warm 2 --worker-args "--managers $m" --out $OUT/m$m > $OUT/m$m/log.txt 2>&1
  tail -3 $OUT/m$m/log.txt
done

#!/bin/bash
# N interleaved rounds (order rotating) of the noisy-neighbour workload in three settings:
# one zone per visit transaction (before), the peer profile as committed (up to 16 zones,
# 4 managers) and 16 zones with 1 manager; then M pairs of the delayed workload (1 / 16).
# Every run under flock /work/bench.lock. From the repo root.
D=$(dirname "$0"); N=${1:-6}; M=${2:-3}
run() { PYTHONPATH=. flock /work/bench.lock python "$D/probe.py" "$1" "$2" >> "$D/runs.jsonl"; }
S=('{"visits_per_transaction": 1}' '{}' '{"managers": 1}')
for i in $(seq "$N"); do
  for k in 0 1 2; do run noisy "${S[$(( (i + k) % 3 ))]}"; done
done
for i in $(seq "$M"); do run delayed '{"visits_per_transaction": 1}'; run delayed '{}'; done

#!/bin/bash
# Interleaved before (7019d74, an archive in /tmp/noisy-base with its own venv) and after
# (this branch) runs of the noisy-neighbour and delayed probes, each under the bench lock.
R=/work/wt-noisy/bench/results/20261124T041424Z-noisy
for i in $(seq $1); do
  (cd /tmp/noisy-base && flock /work/bench.lock env PYTHONPATH=. /tmp/venv-base/bin/python noisy_neighbour_probe.py sqlite default 2>&1 | tail -1 | sed 's/^{/{"tree": "before", /' >> $R/before_after.jsonl)
  (cd /work/wt-noisy && flock /work/bench.lock env PYTHONPATH=. /tmp/venv-noisy/bin/python $R/noisy_neighbour_probe.py sqlite default 2>&1 | tail -1 | sed 's/^{/{"tree": "after", /' >> $R/before_after.jsonl)
done
for i in $(seq $2); do
  (cd /tmp/noisy-base && flock /work/bench.lock env PYTHONPATH=. /tmp/venv-base/bin/python delayed_probe.py 2>&1 | tail -1 | sed 's/^{/{"tree": "before", /' >> $R/before_after_delayed.jsonl)
  (cd /work/wt-noisy && flock /work/bench.lock env PYTHONPATH=. /tmp/venv-noisy/bin/python $R/delayed_probe.py 2>&1 | tail -1 | sed 's/^{/{"tree": "after", /' >> $R/before_after_delayed.jsonl)
done

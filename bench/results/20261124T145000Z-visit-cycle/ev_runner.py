"""The consumer process of eab.py: times each manager visit and counts events, written to
$EVOUT at exit; the consumer is the fewest-held probe's runner (SIGTERM ends it)."""
import atexit, collections, json, os, runpy, time
from pathlib import Path
import quickzones.consumer.manager as mg
import quickzones.consumer.runtime as rt
RUNNER = Path(__file__).resolve().parent.parent / "20261124T123000Z-fewest-held" / "runner.py"
cnt = collections.Counter(); vis = []; batches = []
ovm = mg.Manager.visit_many
def vm(self, refs, *a, **k):
    t = time.perf_counter(); c = time.thread_time()
    r = []
    try:
        r = ovm(self, refs, *a, **k); return r
    finally: vis.append((time.time(), len(refs), (time.perf_counter()-t)*1000, (time.thread_time()-c)*1000, len(r), sum(1 for w in r if w.zone.tenant == "noisy")))
mg.Manager.visit_many = vm
def observer(event, f):
    cnt[event] += 1
    if event == "visits_batched": batches.append((f["zones"], f["items"]))
ostart = rt.Consumer.start
def start(self, *a, **k):
    self.observer = observer
    return ostart(self, *a, **k)
rt.Consumer.start = start
atexit.register(lambda: json.dump({"cnt": cnt, "vis": vis, "batches": batches}, open(os.environ["EVOUT"], "w")))
runpy.run_path(str(RUNNER), run_name="__main__")

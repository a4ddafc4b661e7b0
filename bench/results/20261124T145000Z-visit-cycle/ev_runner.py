import json, os, signal, sys, threading, time, collections
from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
import quickzones.consumer.manager as mg
url, cfg = sys.argv[1], sys.argv[2]
q = open_quick(url)
cnt = collections.Counter(); vis = []
ovm = mg.Manager.visit_many
def vm(self, refs, *a, **k):
    t = time.perf_counter(); c = time.thread_time()
    r = []
    try:
        r = ovm(self, refs, *a, **k); return r
    finally: vis.append((time.time(), len(refs), (time.perf_counter()-t)*1000, (time.thread_time()-c)*1000, len(r), sum(1 for w in r if w.zone.tenant == "noisy")))
mg.Manager.visit_many = vm
batches = []
def observer(event, f):
    cnt[event] += 1
    if event == "visits_batched": batches.append((f["zones"], f["items"]))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**json.loads(cfg)), observer=observer)
c.start()
stop.wait(3600)
c.stop(deadline_s=5.0)
json.dump({"cnt": cnt, "vis": vis, "batches": batches}, open(os.environ["EVOUT"], "w"))
q.close()

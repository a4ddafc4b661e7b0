import json, os, signal, sys, threading, collections, glob
from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
import quickzones.pool as pool
import quickzones.consumer.runtime as rt
import quickzones.consumer.completer as comp
import quickzones.consumer.scanner as sc

MODE = os.environ.get("GATE", "")
if os.environ.get("SWI"): sys.setswitchinterval(float(os.environ["SWI"]))
gate = threading.Event(); gate.set()
if MODE:
    ovd = rt.Consumer._visit_and_dispatch
    def vd(self, refs):
        gate.clear()
        try: return ovd(self, refs)
        finally: gate.set()
    rt.Consumer._visit_and_dispatch = vd
    if "s" in MODE:
        oscan = sc.Scanner.scan_once
        def scan(self, *a, **k):
            gate.clear()
            try: return oscan(self, *a, **k)
            finally: gate.set()
        sc.Scanner.scan_once = scan
    if "w" in MODE:
        oget = pool.FairQueue.get
        def get(self):
            gate.wait(0.05)
            return oget(self)
        pool.FairQueue.get = get
    if "f" in MODE:
        oflush = comp.BatchedCompleter.flush
        def flush(self):
            gate.wait(0.05)
            return oflush(self)
        comp.BatchedCompleter.flush = flush

def context_switches():
    out = collections.Counter()
    names = {th.native_id: th.name for th in threading.enumerate()}
    for task in glob.glob("/proc/self/task/*"):
        try:
            name = names.get(int(task.rsplit("/", 1)[1]), "?")
            status = open(task + "/status").read()
        except OSError:
            continue
        v = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        f = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[name.rstrip("0123456789_-")] += v + f
    return dict(out)

url, cfg = sys.argv[1], sys.argv[2]
q = open_quick(url)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**json.loads(cfg)))
c.start()
stop.wait(3600)
if os.environ.get("CTXOUT"):
    with open(os.environ["CTXOUT"], "w") as f: json.dump(context_switches(), f)
c.stop(deadline_s=5.0)
q.close()

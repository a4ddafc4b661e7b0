"""The consumer process of diagnose_probe.py: per-event and per-call timings, written to
its third argument at SIGTERM."""
import json, signal, sys, threading, time
from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
url, cfg, out = sys.argv[1], sys.argv[2], sys.argv[3]
q = open_quick(url)
import quickzones.consumer.scanner as sc, quickzones.consumer.manager as mg, quickzones.consumer.completer as cp
import quickzones.kv as kvm
def timed(cls, name, tag):
    orig = getattr(cls, name)
    def f(*a, **k):
        t = time.time(); c = time.thread_time()
        try: return orig(*a, **k)
        finally: log.append((tag, 0, (time.thread_time()-c)*1000, t, (time.time()-t)*1000))
    setattr(cls, name, f)
timed(sc.Scanner, "scan_once", "T_scan")
timed(mg.Manager, "visit_many", "T_visit")
import quickzones.backends.sqlite.store as ss
timed(ss.SQLiteStore, "_begin_immediate", "T_begin")
timed(ss.SQLiteStore, "_commit_on", "T_commit")

log = []
def observer(event, f):
    if event == "dequeued":
        log.append(("d", f["zone"].tenant, f["enqueued_ms"], time.time()))
    elif event == "scan":
        log.append(("scan", f["pointers"], c._flight.count, time.time(), time.process_time()))
    elif event in ("visits_batched", "visited"):
        log.append((event, f.get("pointers", f.get("zones", f.get("items"))), 0, time.time()))
    elif event == "pointer_leased":
        log.append(("l", f["zone"].tenant, f["lag_ms"], time.time()))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**json.loads(cfg)), observer=observer)
c.start()
stop.wait(3600)
c.stop(deadline_s=5.0)
import os as _os
tm = _os.times(); log.append(("times", 0, 0, tm.user, tm.system))
json.dump(log, open(out, "w"))
q.close()

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
def closing_gate(cls, name):
    """While ``cls.name`` runs, the gate is shut (workers and flusher wait at it)."""
    orig = getattr(cls, name)
    def shut(*a, **k):
        gate.clear()
        try: return orig(*a, **k)
        finally: gate.set()
    setattr(cls, name, shut)

def waiting_at_gate(cls, name):
    """``cls.name`` first waits (at most 50 ms) while the gate is shut."""
    orig = getattr(cls, name)
    def wait(*a, **k):
        gate.wait(0.05)
        return orig(*a, **k)
    setattr(cls, name, wait)

if MODE:
    closing_gate(rt.Consumer, "_visit_and_dispatch")
    if "s" in MODE:
        closing_gate(sc.Scanner, "scan_once")
    if "w" in MODE:
        waiting_at_gate(pool.FairQueue, "get")
    if "f" in MODE:
        waiting_at_gate(comp.BatchedCompleter, "flush")

url, cfg = sys.argv[1], sys.argv[2]
q = open_quick(url)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**json.loads(cfg)))
c.start()
stop.wait(3600)
c.stop(deadline_s=5.0)
q.close()

import os, runpy, sys, threading
from pathlib import Path
import quickzones.pool as pool
import quickzones.consumer.runtime as rt
import quickzones.consumer.completer as comp
import quickzones.consumer.scanner as sc

RUNNER = Path(__file__).resolve().parent.parent / "20261124T123000Z-fewest-held" / "runner.py"
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

# The consumer process itself: the fewest-held probe's runner (SIGTERM ends it).
runpy.run_path(str(RUNNER), run_name="__main__")

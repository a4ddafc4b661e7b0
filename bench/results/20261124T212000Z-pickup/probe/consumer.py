import json, os, signal, sys, threading, time, collections
sys.argv = sys.argv  # url --config X
from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
url = sys.argv[1]; cfg = json.loads(sys.argv[3])
from quickzones.backends.sqlite import store as _st
_orig = _st.SQLiteStore._begin_immediate
waits = []
def _bi(self, conn):
    t = time.time(); _orig(self, conn); waits.append((t, time.time() - t))
_st.SQLiteStore._begin_immediate = _bi
from quickzones.consumer import scanner as _sc
_orig_scan = _sc.Scanner.scan_once
scans = []
def _scan(self, *a, **k):
    t = time.time(); r = _orig_scan(self, *a, **k); scans.append((t, time.time() - t, len(r))); return r
_sc.Scanner.scan_once = _scan
from quickzones.consumer import manager as _mg
_orig_vm = _mg.Manager.visit_many
visits = []
def _vm(self, refs, *a, **k):
    t = time.time(); c = time.thread_time(); r = _orig_vm(self, refs, *a, **k); visits.append((t, time.time() - t, time.thread_time() - c, len(refs), len(r))); return r
_mg.Manager.visit_many = _vm
_orig_iw = _sc.Scanner.idle_wait
iwaits = []
def _iw(self, stopping, **k):
    t = time.time(); to = self.until_next_vesting(); _orig_iw(self, stopping, **k); iwaits.append((t, time.time() - t, to))
_sc.Scanner.idle_wait = _iw
from quickzones.consumer import completer as _cp
_orig_fl = _cp.BatchedCompleter.flush
flushes = []
def _fl(self):
    t = time.time(); c = time.thread_time(); n = _orig_fl(self); flushes.append((t, time.time() - t, time.thread_time() - c, n)); return n
_cp.BatchedCompleter.flush = _fl
import gc
gcs = []
_gcs = {}
def _gccb(phase, info):
    if phase == "start": _gcs["t"] = time.time()
    else: gcs.append((_gcs["t"], time.time() - _gcs["t"], info["generation"], info["collected"]))
gc.callbacks.append(_gccb)
sys.path.insert(0, '/tmp/probe'); import ckpatch
q = open_quick(url)
counts = collections.Counter()
timeline = []
items = {}
lags = []
t0 = [None]
def observer(event, fields):
    counts[event] += 1
    now = time.time()
    if event == "dequeued" and fields["zone"].tenant.startswith("t"):
        items[(fields["zone"].tenant, fields["item_id"])] = [now, fields["enqueued_ms"] / 1000, None]
    elif event == "started" and fields["zone"].tenant.startswith("t"):
        v = items.get((fields["zone"].tenant, fields["item_id"]))
        if v: v[2] = now
    elif event == "pointer_leased" and fields["zone"].tenant.startswith("t"):
        lags.append((now, fields["lag_ms"]))
    if event in ("one_transaction_visit_conflict", "visits_batched", "completions_flushed", "pointer_lease_failed"):
        timeline.append((now, event, fields.get("zones"), fields.get("items"), fields.get("reason")))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
c = q.consumer(ConsumerConfig(**cfg), observer=observer)
c.start()
import subprocess
if os.environ.get('SPY'):
    subprocess.Popen(['/tmp/venv/bin/py-spy','record','--pid',str(os.getpid()),'-o',os.environ['SPY'],'--format','raw','-r','400','--duration','3','--threads','--nonblocking'] + (['--gil'] if os.environ.get('SPY_GIL') else []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
stop.wait(3600)
c.stop(deadline_s=5.0)
with open(os.environ.get("PROBE_OUT", "/tmp/probe/events.json"), "w") as f:
    json.dump({"counts": counts, "timeline": timeline, "items": list(items.values()), "lags": lags, "waits": waits, "scans": scans, "visits": visits, "iwaits": iwaits, "flushes": flushes, "gcs": gcs, "ck": ckpatch.CK, "holds": ckpatch.HOLDS, "gcobjs": len(gc.get_objects())}, f)
q.close()

"""bench.quickrun's consumer process with stage tracing (monkeypatched, no core edits).

Records, as JSON lines to $TRACE_OUT at stop: every scan (start, end, chosen refs),
every visit (start, lease committed, dequeued), and per item: item id, zone tenant,
payload enqueue time, the visit's ref, dequeue time, worker start time.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import msgpack

from bench.quickrun import open_quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer import manager as manager_mod
from quickzones.consumer import runtime as runtime_mod
from quickzones.consumer import scanner as scanner_mod

scans: list = []
items: dict = {}
visits: list = []
tl = threading.local()

_scan_once = scanner_mod.Scanner.scan_once


def scan_once(self):
    t0 = time.time()
    chosen = _scan_once(self)
    scans.append((t0, time.time(), [(r.pointer_id, r.vesting_ms) for r in chosen], self.left_vested))
    return chosen


scanner_mod.Scanner.scan_once = scan_once

_visit = manager_mod.Manager.visit


def visit(self, ref, hand_out=None):
    tl.v = v = {"pid": ref.pointer_id, "vest": ref.vesting_ms, "t0": time.time()}
    try:
        return _visit(self, ref, hand_out)
    finally:
        v["t1"] = time.time()
        visits.append(v)
        tl.v = None


manager_mod.Manager.visit = visit

_exec = runtime_mod.Consumer._execute_logged


def execute_logged(self, work):
    rec = items.get(work.item.item_id)
    if rec is not None:
        rec["exec"] = time.time()
    return _exec(self, work)


runtime_mod.Consumer._execute_logged = execute_logged


rare: list = []


def observer(event, fields):
    v = getattr(tl, "v", None)
    if event in ("one_transaction_visit_conflict", "pointer_lease_failed", "dequeue_error",
                 "pointer_requeue_error", "lease_lost", "pointer_lost"):
        rare.append((time.time(), event, str(fields.get("reason", fields.get("zone", ""))), v and v["pid"]))
    if event == "pointer_leased" and v is not None:
        v["leased"] = time.time()
        v["zone"] = fields["zone"].tenant
    elif event == "dequeued":
        items[fields["item_id"]] = {
            "tenant": fields["zone"].tenant,
            "enq_ms": fields["enqueued_ms"],
            "deq": time.time(),
            "pid": v and v["pid"],
            "vest": v and v["vest"],
            "vt0": v and v["t0"],
            "leased": v and v.get("leased"),
        }
    elif event == "visited" and v is not None:
        v["items"] = fields["items"]


from quickzones.backends.sqlite import store as sqlite_store  # noqa: E402

commits: list = []
gcs: list = []
_gc_t: list = [0.0]


def _gc_cb(phase, info):
    if phase == "start":
        _gc_t[0] = time.perf_counter()
    else:
        gcs.append((time.time(), info["generation"], (time.perf_counter() - _gc_t[0]) * 1000, info["collected"]))


import gc  # noqa: E402

gc.callbacks.append(_gc_cb)
cpu: list = []


class TimedLock:
    def __init__(self, lock):
        self.lock = lock

    def acquire(self, blocking=True, timeout=-1):
        t = time.time()
        ok = self.lock.acquire(blocking, timeout)
        tl.lockwait = time.time() - t
        return ok

    def release(self):
        self.lock.release()


_begin = sqlite_store.SQLiteStore._begin_immediate


def begin_immediate(self, conn):
    t = time.time()
    _begin(self, conn)
    tl.begin = time.time() - t


sqlite_store.SQLiteStore._begin_immediate = begin_immediate
_commit_request = sqlite_store.SQLiteTransaction._commit_request


def commit_request(self, request):
    if not isinstance(self._store._write_lock, TimedLock):
        self._store._write_lock = TimedLock(self._store._write_lock)
    tl.lockwait = tl.begin = 0.0
    t = time.time()
    try:
        return _commit_request(self, request)
    finally:
        commits.append((threading.current_thread().name.rsplit("-", 1)[0], t, time.time() - t,
                        tl.lockwait, tl.begin))


sqlite_store.SQLiteTransaction._commit_request = commit_request


def sampler(stop):
    while not stop.wait(0.05):
        cpu.append((time.time(), time.process_time()))


if os.environ.get("NO_GATE"):
    from quickzones import visit_gate
    visit_gate.OneTransactionGate.conflicted = lambda self: None


def main() -> None:
    if os.environ.get("SWITCH_S"):
        sys.setswitchinterval(float(os.environ["SWITCH_S"]))
    url = sys.argv[1]
    cfg = json.loads(sys.argv[2])
    out = os.environ["TRACE_OUT"]
    q = open_quick(url)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = q.consumer(ConsumerConfig(**cfg), observer=observer)
    consumer.start()
    threading.Thread(target=sampler, args=(stop,), daemon=True).start()
    stop.wait(3600)
    consumer.stop(deadline_s=5.0)
    with open(out, "w") as f:
        json.dump({"rare": rare, "gcs": gcs, "commits": commits, "cpu": cpu, "scans": scans, "visits": visits, "items": items}, f)
    q.close()



if os.environ.get("RESCAN_MULT"):
    # Experiment: re-scan when the selected deque is RESCAN_MULT x idle_sleep_s old
    # (the code has 10): the same method, recompiled with the constant changed.
    import inspect
    import textwrap

    src = textwrap.dedent(inspect.getsource(scanner_mod.Scanner.run))
    assert "cfg.idle_sleep_s * 10" in src
    src = src.replace("cfg.idle_sleep_s * 10", "cfg.idle_sleep_s * " + os.environ["RESCAN_MULT"])
    ns: dict = {}
    exec(compile(src, scanner_mod.__file__, "exec"), vars(scanner_mod), ns)
    scanner_mod.Scanner.run = ns["run"]


if __name__ == "__main__":
    main()

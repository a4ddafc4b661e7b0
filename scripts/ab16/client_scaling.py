"""Does this machine scale? Raw FoundationDB client transactions (a read, five writes and a
commit each, DIAG_THREADS threads a process, default 8) and pure-Python loops at 1, 2, 4
and 8 processes: the rate, its ratio to one process, and CPU a transaction. On the 16-core
machine: bash .dev/run.sh python3 scripts/ab16/client_scaling.py 1,2,4,8"""
import multiprocessing as mp
import os
import random
import resource
import sys
import threading
import time

def fdb_proc(cluster, warm, seconds, threads, q):
    import fdb
    fdb.api_version(730)
    db = fdb.open(cluster)
    end = time.monotonic() + warm + seconds
    counts = [0] * threads
    def loop(i):
        rnd = random.Random(os.getpid() * 100 + i)
        n = 0
        while time.monotonic() < end:
            tr = db.create_transaction()
            k = b"diag/" + rnd.randbytes(12)
            try:
                tr.get(k).wait()
                for j in range(5):
                    tr.set(k + bytes([j]), b"x" * 60)
                tr.commit().wait()
                n += 1
                counts[i] = n
            except fdb.FDBError as e:
                tr.on_error(e).wait()
    ts = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for t in ts: t.start()
    time.sleep(warm)
    c0 = sum(counts); r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.monotonic()
    time.sleep(seconds)
    c1 = sum(counts); r1 = resource.getrusage(resource.RUSAGE_SELF); t1 = time.monotonic()
    q.put((c1 - c0, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), t1 - t0))
    for t in ts: t.join(5)

def spin_proc(seconds, q):
    end = time.monotonic() + seconds; n = 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    while time.monotonic() < end:
        for _ in range(1000): n += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    q.put((n, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), seconds))

def run(target, args, procs):
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args, q)) for _ in range(procs)]
    for p in ps: p.start()
    res = [q.get(timeout=120) for _ in ps]
    for p in ps: p.join(30)
    return res

if __name__ == "__main__":
    cluster = os.environ.get("FDB_CLUSTER_FILE")
    counts = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8").split(",")]
    threads = int(os.environ.get("DIAG_THREADS", "8"))
    print(f"cores {os.cpu_count()}; fdb threads a process {threads}", flush=True)
    base = None
    for n in counts:
        res = run(spin_proc, (3.0,), n)
        rate = sum(r[0] for r in res) / 3.0
        base = base or rate
        print(f"spin x{n}: {rate/1e6:.1f} M/s (x{rate/base:.2f}), cpu {sum(r[1] for r in res)/3:.2f} cores", flush=True)
    base = None
    for n in counts:
        res = run(fdb_proc, (cluster, 2.0, 6.0, threads), n)
        tx = sum(r[0] for r in res); wall = max(r[2] for r in res); cpu = sum(r[1] for r in res)
        rate = tx / wall; base = base or rate
        print(f"fdb tx x{n}: {rate:,.0f} tx/s (x{rate/base:.2f}), client cpu {cpu/wall:.2f} cores, {1000*cpu/tx:.3f} ms a tx", flush=True)

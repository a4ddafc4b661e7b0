"""Diagnostic: what a one-transaction visit conflicts with on a real FoundationDB.

``python -m bench.visits_conflict_keys [--n 3000] [--tenants 1]``

One consumer in this process (``throughput_config(workers=4, dequeue_max=10,
one_transaction_visits=True)``) drains ``n`` no-op items of ``--tenants`` tenants on
fdb://. The top-level queue's ``run_visit`` is wrapped (here, not in the library) to set the
binding's ``report_conflicting_keys`` option and, when the one-transaction commit fails,
read ``\\xff\\xff/transaction/conflicting_keys/``: the key ranges whose writes by others
made it conflict. They are counted by kind (pointer, pointer vesting index, zone items,
zone order index, zone count, ...). Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from bench.common import fdb_url, log
from bench.quickrun import JOB, open_quick, throughput_config, wait_completed
from quickzones.store.kv import UNCOMMITTED, KVError
from quickzones.store.toplevel import TopLevelQueue
from quickzones.store.tuple_layer import fdbtuple

CONFLICTS = b"\xff\xff/transaction/conflicting_keys/"
kinds: Counter[str] = Counter()
samples: list[str] = []
attempts = Counter[str]()


def _kind(key: bytes) -> str:
    try:
        parts = fdbtuple.unpack(key)
    except Exception:  # a range end (key + b"\x00" and the like) or a partial key
        for cut in range(len(key), 0, -1):
            try:
                parts = fdbtuple.unpack(key[:cut])
                break
            except Exception:
                continue
        else:
            return f"raw:{key[:24]!r}"
    # (root, "z", app, tenant, tag, ...) or (root, "c", cluster, shard, tag, ...)
    if len(parts) >= 5 and parts[1] == "z":
        return f"zone/{parts[4]}"
    if len(parts) >= 5 and parts[1] == "c":
        return f"cluster/{parts[4]}"
    return "other:" + "/".join(str(p) for p in parts[1:3])


def _show(key: bytes, now: int) -> str:
    for cut in range(len(key), 0, -1):
        try:
            parts = list(fdbtuple.unpack(key[:cut]))
        except Exception:
            continue
        shown = [f"now{p - now:+d}ms" if isinstance(p, int) and p > 10**12 else p for p in parts]
        return f"{shown[1:]} +{len(key) - cut} bytes"
    return repr(key[:60])


def attempt_once_reporting(db: Any, fn: Any) -> Any:
    tr = db.create_transaction()
    raw = tr._tr
    prefix = tr._prefix
    raw.options.set_report_conflicting_keys()
    committed = False
    attempts["tried"] += 1
    try:
        result = fn(tr)
        tr.commit()
        committed = True
        attempts["committed"] += 1
        return result
    except KVError as err:
        if err.retryable:
            attempts["conflicted"] += 1
            try:
                got = list(raw.get_range(CONFLICTS, CONFLICTS + b"\xff"))
                now = int(time.time() * 1000)
                for kv in got:
                    key = kv.key[len(CONFLICTS) :]
                    if key.startswith(prefix):
                        key = key[len(prefix) :]
                    if kv.value == b"1":  # the start of a conflicting range
                        kinds[_kind(key)] += 1
                    if len(samples) < 40:
                        # start (1) or end (0) of a range, with the key's parts; a
                        # vesting time is shown relative to now (ms)
                        samples.append(f"{kv.value!r} {_show(key, now)}")
            except Exception as exc:  # reported, not fatal
                kinds[f"unreadable:{type(exc).__name__}:{exc}"[:120]] += 1
            return UNCOMMITTED
        raise
    finally:
        if not committed:
            tr.reset()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.visits_conflict_keys")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--tenants", type=int, default=1)
    args = ap.parse_args(argv)
    # The top-level queue's one-transaction visit, over FoundationDB: run with reporting.
    TopLevelQueue.run_visit = lambda top, fn: attempt_once_reporting(top.kv, fn)  # type: ignore[method-assign]
    q = open_quick(fdb_url("conflict-keys"))
    t = time.time()
    per = args.n // args.tenants
    for i in range(args.tenants):
        for j in range(0, per, 100):
            k = min(100, per - j)
            q.enqueue_many(JOB, [{"t": f"t{i}", "e": t, "d": t}] * k, app="b", tenant=f"t{i}")
    os.environ["BENCH_OUT"] = os.path.join(tempfile.gettempdir(), f"bench-ck-{os.getpid()}")
    cfg = throughput_config(workers=4, dequeue_max=10, one_transaction_visits=True)
    consumer = q.consumer(cfg)
    consumer.start()
    t0 = time.time()
    done = wait_completed(consumer, per * args.tenants, 120)
    consumer.stop(deadline_s=5.0)
    stats = dict(consumer.stats)
    q.close()
    res = {
        "n": per * args.tenants,
        "tenants": args.tenants,
        "seconds": done - t0,
        "one_transaction_attempts": dict(attempts),
        "conflicting_range_kinds": dict(kinds),
        "samples": samples,
        "visited": stats.get("visited", 0),
        "one_transaction_visit_conflict": stats.get("one_transaction_visit_conflict", 0),
        "pointer_lease_failed": stats.get("pointer_lease_failed", 0),
    }
    print(json.dumps(res, indent=1))
    log(f"done in {done - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

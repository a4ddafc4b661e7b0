"""What an enqueue written natively in SQL would cost, beside today's enqueue over the KV
seam and the peers, in one sitting: the measurement behind the design in
``docs/backends.md`` ("Zones native in SQL: the design", issue 42 point 1, issue 44 point 1).

``python -m bench.native_probe [--store postgres,sqlite] [--seconds 5] [--runs 3] [--out DIR]``

**PostgreSQL** (``--store postgres``). One private PostgreSQL cluster
(:func:`bench.servers.postgres_server`, fsync on) holds every variant. The native
variant is not a store: it is the one statement such a store's enqueue would send
(:data:`NATIVE_ENQUEUE`: the item's row, and the zone's pointer row share-locked so
pointer collection cannot delete it under the enqueue, or made where absent), on tables
shaped as that design has them (:data:`NATIVE_TABLES`), with the client doing quick's own
work for an item (``Quick._new_item``, the record's encoding).
Per run, alternating the order run by run:

1. **one producer**, autocommit, one call a job into one of 1,000 tenants at random, for
   ``--seconds``: ``Quick.enqueue`` (today's store, every URL option at its default), the
   native statement, a plain ``INSERT`` into a jobs table (the floor), procrastinate's
   ``defer`` (its peer in :mod:`bench.postgres_peer`): calls/s and the producer's CPU a call;
2. **eight application transactions at once** with nothing between the enqueue and
   COMMIT (``bench.pg_app_txn``'s W = 0, without its consumer: no native consumer exists
   to run beside the native variant): BEGIN; INSERT an order; the enqueue; COMMIT, with
   ``Quick.enqueue_on``, the native statement, or the plain INSERT: transactions/s;
3. **a drain**: ``--drain-items`` items of one tenant, by ``Consumer.run_until_idle``
   (``workers=4``, in this process: its CPU an item and items/s) and by the native store's
   work alone (:func:`postgres_drain`: visits of four under row locks, :data:`PG_VISIT`
   and :data:`PG_REQUEUE`, and a completion each, on one thread).

**SQLite** (``--store sqlite``): one producer, one call a job into one tenant (as
``bench.peers_users`` enqueues), each variant on a file of its own in WAL mode with
``synchronous=NORMAL`` (the store's defaults), for ``--seconds``, alternating:
``Quick.enqueue`` on today's store; the native statements (:data:`SQLITE_ENQUEUE`:
``BEGIN IMMEDIATE``, the item's row, the pointer made or pulled earlier in one upsert,
``COMMIT``: SQLite's one writer at a time needs no row locks), the client doing the same
work for the item as above; Huey's enqueue (:class:`bench.peers.huey_peer.HueyPeer`, the
fastest peer there): calls/s and CPU a call. Then ``--drain-items`` (5,000) items of one
tenant drained, alternating: by quick's consumer (``run_until_idle``, ``workers=4``: the
process's CPU an item), and by the native store's work alone (:func:`sqlite_drain`:
visits of four items under ``BEGIN IMMEDIATE``, :data:`SQLITE_VISIT`, and a completion
transaction each: CPU an item and how long each transaction held the write lock).

Medians over ``--runs``; results in ``bench/results/<UTC>-native-probe/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import log, write_run
from bench.pg_app_txn import TENANTS, _create_app_tables, single_producer_procrastinate
from bench.quickrun import JOB, open_quick

APP = "probe_app"  # the application's schema (bench.pg_app_txn's orders and jobs tables)
NATIVE_TABLES = """
CREATE SCHEMA IF NOT EXISTS probe_native;
CREATE TABLE IF NOT EXISTS probe_native.items (
  zone text NOT NULL, id text NOT NULL, priority smallint NOT NULL,
  vesting_ms bigint NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, lease_id text,
  attempts int NOT NULL DEFAULT 0, record bytea NOT NULL, PRIMARY KEY (zone, id));
CREATE INDEX IF NOT EXISTS items_order ON probe_native.items (zone, priority, vesting_ms, seq);
CREATE TABLE IF NOT EXISTS probe_native.pointers (
  zone text PRIMARY KEY, shard int NOT NULL, vesting_ms bigint NOT NULL, lease_id text);
CREATE INDEX IF NOT EXISTS pointers_order ON probe_native.pointers (shard, vesting_ms);
"""
# Part one of the two-part enqueue in one statement: the item's row; the pointer's row
# locked FOR KEY SHARE (enqueuers of one zone share it, a consumer's lease, an UPDATE,
# does not wait for it, pointer collection's delete does) or made where absent. The
# pointer's vesting time and lease come back, for part two to pull an idle one earlier.
NATIVE_ENQUEUE = """
WITH item AS (
  INSERT INTO probe_native.items (zone, id, priority, vesting_ms, record)
  VALUES (%(zone)s, %(id)s, %(priority)s, %(vesting)s, %(record)s)
), p AS (
  SELECT vesting_ms, lease_id FROM probe_native.pointers WHERE zone = %(zone)s FOR KEY SHARE
), made AS (
  INSERT INTO probe_native.pointers (zone, shard, vesting_ms)
  SELECT %(zone)s, %(shard)s, %(vesting)s WHERE NOT EXISTS (SELECT 1 FROM p)
  ON CONFLICT (zone) DO NOTHING RETURNING 1
)
SELECT (SELECT vesting_ms FROM p), (SELECT lease_id FROM p), EXISTS (SELECT 1 FROM made)
"""
PLAIN_INSERT = f"INSERT INTO {APP}.jobs (queue, payload) VALUES (%s, %s)"
INSERT_ORDER = f"INSERT INTO {APP}.orders (tenant, total_cents) VALUES (%s, %s)"
KINDS = ("quick", "native", "plain")
SQLITE_KINDS = ("quick", "native", "huey")
SQLITE_TABLES = (
    "CREATE TABLE items (seq INTEGER PRIMARY KEY, zone TEXT NOT NULL, id TEXT NOT NULL,"
    " priority INTEGER NOT NULL, vesting_ms INTEGER NOT NULL, lease_id TEXT,"
    " attempts INTEGER NOT NULL DEFAULT 0, record BLOB NOT NULL, UNIQUE (zone, id))",
    "CREATE INDEX items_order ON items (zone, priority, vesting_ms, seq)",
    "CREATE TABLE pointers (zone TEXT PRIMARY KEY, shard INTEGER NOT NULL,"
    " vesting_ms INTEGER NOT NULL, lease_id TEXT) WITHOUT ROWID",
    "CREATE INDEX pointers_order ON pointers (shard, vesting_ms)",
)
# Both parts of the enqueue under SQLite's write lock: the item, then the pointer made, or
# pulled earlier where it vests later and nobody leases it.
SQLITE_ENQUEUE = (
    "INSERT INTO items (zone, id, priority, vesting_ms, record)"
    " VALUES (:zone, :id, :priority, :vesting, :record)",
    "INSERT INTO pointers (zone, shard, vesting_ms) VALUES (:zone, :shard, :vesting)"
    " ON CONFLICT (zone) DO UPDATE SET vesting_ms = excluded.vesting_ms"
    " WHERE pointers.vesting_ms > excluded.vesting_ms AND pointers.lease_id IS NULL",
)


def native_args(q: Any, tenant: str) -> dict[str, Any]:
    """The client's work for one native enqueue: quick's own new item and record."""
    from quickzones.clock import now_ms
    from quickzones.store.records import WorkItem, encode_item

    new = q._new_item(JOB, {"t": tenant, "e": time.time(), "d": 0.0}, 0.0, 0, None, None)
    now = now_ms(q.clock)
    record = WorkItem(
        item_id=new.item_id,
        job_type=new.job_type,
        payload=new.payload,
        priority=0,
        vesting_ms=now,
        enqueued_ms=now,
        content_type=new.content_type,
        delivery=new.delivery,
        meta=dict(new.meta),
    )
    zone = f"a/{tenant}"
    return {"zone": zone, "id": new.item_id, "priority": 0, "vesting": now,
            "record": encode_item(record), "shard": hash(zone) % 16}  # fmt: skip


def _connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0)


def timed_calls(call: Callable[[], object], seconds: float) -> dict[str, float]:
    """``call`` again and again for ``seconds``: calls/s and this thread's CPU a call."""
    n = 0
    cpu0, t0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        call()
        n += 1
    cpu1, t1 = time.thread_time(), time.perf_counter()
    return {"calls_s": n / (t1 - t0), "cpu_ms": (cpu1 - cpu0) / max(n, 1) * 1000}


def one_producer(kind: str, dsn: str, url: str, q: Any, seconds: float) -> dict[str, float]:
    """``kind``'s enqueues, one call a job, autocommit, for ``seconds``."""
    rng = random.Random(1)

    def tenant() -> str:
        return f"t{rng.randrange(TENANTS)}"

    with contextlib.ExitStack() as stack:
        if kind == "quick":
            own = open_quick(url)
            stack.callback(own.close)

            def call() -> object:
                t = tenant()
                return own.enqueue(JOB, {"t": t, "e": time.time(), "d": 0.0}, app="a", tenant=t)

        else:
            conn = stack.enter_context(_connect(dsn))
            if kind == "native":

                def call() -> object:
                    return conn.execute(NATIVE_ENQUEUE, native_args(q, tenant()))

            else:

                def call() -> object:
                    return conn.execute(PLAIN_INSERT, ("default", f'{{"t": "{tenant()}"}}'))

        return timed_calls(call, seconds)


def app_transactions(kind: str, dsn: str, q: Any, threads: int, seconds: float) -> float:
    """``threads`` threads looping BEGIN; INSERT order; ``kind``'s enqueue; COMMIT for
    ``seconds``: transactions/s."""
    conns = [_connect(dsn) for _ in range(threads)]
    done = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def loop(k: int) -> None:
        conn, rng = conns[k], random.Random(k)
        barrier.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            tenant = f"t{rng.randrange(TENANTS)}"
            with conn.transaction():
                conn.execute(INSERT_ORDER, (tenant, 1))
                if kind == "quick":
                    q.enqueue_on(conn, JOB, {"t": tenant, "e": time.time(), "d": 0.0}, app="a",
                                 tenant=tenant)  # fmt: skip
                elif kind == "native":
                    conn.execute(NATIVE_ENQUEUE, native_args(q, tenant))
                else:
                    conn.execute(PLAIN_INSERT, ("default", f'{{"t": "{tenant}"}}'))
            done[k] += 1

    workers = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
    for t in workers:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    return sum(done) / elapsed


def one_run(dsn: str, url: str, q: Any, r: int, args: argparse.Namespace) -> dict[str, Any]:
    order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
    run: dict[str, Any] = {"one_producer": {}, "app_transactions_tx_s": {}}
    peers = ("procrastinate",) if args.procrastinate else ()
    for kind in order + peers if r % 2 == 0 else peers + order:
        if kind == "procrastinate":
            with tempfile.TemporaryDirectory(prefix="bench-native-") as work:
                got = single_producer_procrastinate(dsn, args.seconds, Path(work))
            run["one_producer"][kind] = {"calls_s": got["jobs_s"]}
        else:
            run["one_producer"][kind] = one_producer(kind, dsn, url, q, args.seconds)
        log(f"run {r + 1} one producer {kind}: {run['one_producer'][kind]}")
    for kind in order:
        tx = app_transactions(kind, dsn, q, args.threads, args.seconds)
        run["app_transactions_tx_s"][kind] = tx
        log(f"run {r + 1} {args.threads} application transactions {kind}: {tx:.0f} tx/s")
    return run


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind in runs[0]["one_producer"]:
        for field in runs[0]["one_producer"][kind]:
            out[f"one producer {kind} {field}"] = statistics.median(
                run["one_producer"][kind][field] for run in runs
            )
    for kind in KINDS:
        out[f"application transactions {kind} tx_s"] = statistics.median(
            run["app_transactions_tx_s"][kind] for run in runs
        )
    return out


def table(m: dict[str, float]) -> str:
    plain_1p = m["one producer plain calls_s"]
    plain_tx = m["application transactions plain tx_s"]
    peer = m.get("one producer procrastinate calls_s")
    rows = ["| variant | one producer, calls/s | CPU a call | x procrastinate | "
            "8 app transactions, tx/s | x plain INSERT |", "|---|---|---|---|---|---|"]  # fmt: skip
    for kind in (*KINDS, "procrastinate"):
        rate = m.get(f"one producer {kind} calls_s")
        if rate is None:
            continue
        cpu = m.get(f"one producer {kind} cpu_ms")
        tx = m.get(f"application transactions {kind} tx_s")
        rows.append(
            f"| {kind} | {rate:,.0f} ({rate / plain_1p:.2f} of plain) | "
            + (f"{cpu:.3f} ms" if cpu is not None else "-")
            + " | "
            + (f"{rate / peer:.2f}x" if peer else "-")
            + " | "
            + (f"{tx:,.0f} | {tx / plain_tx:.3f}" if tx is not None else "- | -")
            + " |"
        )
    rows += [
        "",
        "| drain (PostgreSQL) | CPU an item | items/s |",
        "|---|---|---|",
        f"| quick consumer, workers=4 | {m['drain quick cpu_ms']:.3f} ms"
        f" | {m['drain quick items_s']:,.0f} |",
        f"| native visits and completions alone, one thread | {m['drain native cpu_ms']:.3f} ms"
        f" | {m['drain native items_s']:,.0f} |",
    ]
    return "\n".join(rows)


def sqlite_one_producer(kind: str, folder: Path, q: Any, seconds: float) -> dict[str, float]:
    """``kind``'s enqueues into one tenant on SQLite, one call a job, for ``seconds``."""
    import sqlite3

    with contextlib.ExitStack() as stack:
        if kind == "quick":
            own = open_quick(f"sqlite:///{folder / 'quick.db'}")
            stack.callback(own.close)

            def call() -> object:
                return own.enqueue(JOB, {"t": "t0", "e": time.time(), "d": 0.0}, app="a",
                                   tenant="t0")  # fmt: skip

        elif kind == "native":
            conn = sqlite3.connect(folder / "native.db", isolation_level=None)
            stack.callback(conn.close)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            for statement in SQLITE_TABLES:
                conn.execute(statement)

            def call() -> object:
                item = native_args(q, "t0")
                conn.execute("BEGIN IMMEDIATE")
                for statement in SQLITE_ENQUEUE:
                    conn.execute(statement, item)
                return conn.execute("COMMIT")

        else:
            from bench.peers.huey_peer import HueyPeer

            peer = HueyPeer(folder)
            stack.callback(peer.reset)

            def call() -> object:
                return peer.enqueue("t0")

        return timed_calls(call, seconds)


# A visit of one zone under the write lock, the design's "locks first" (docs/backends.md):
# the pointer leased, the first vested items leased (their vesting time moved by the
# lease), the pointer requeued to the zone's next vesting time, one statement each.
SQLITE_VISIT = (
    "UPDATE pointers SET lease_id = :lease, vesting_ms = :now + :lease_ms"
    " WHERE zone = :zone AND vesting_ms <= :now RETURNING vesting_ms",
    "UPDATE items SET lease_id = :lease, vesting_ms = :now + :lease_ms,"
    " attempts = attempts + 1 WHERE seq IN (SELECT seq FROM items WHERE zone = :zone"
    " AND vesting_ms <= :now ORDER BY priority, vesting_ms, seq LIMIT :n)"
    " RETURNING id, record",
    # The zone's next vesting time: the first entry of each priority (a loose index scan,
    # as the KV zones' min_vesting_ms reads it), never a scan of the zone's items.
    "WITH RECURSIVE firsts(priority, vesting_ms) AS ("
    " SELECT * FROM (SELECT priority, vesting_ms FROM items WHERE zone = :zone"
    " ORDER BY priority, vesting_ms LIMIT 1)"
    " UNION ALL SELECT (SELECT priority FROM items WHERE zone = :zone"
    " AND priority > firsts.priority ORDER BY priority, vesting_ms LIMIT 1),"
    " (SELECT vesting_ms FROM items WHERE zone = :zone AND priority > firsts.priority"
    " ORDER BY priority, vesting_ms LIMIT 1) FROM firsts WHERE firsts.priority IS NOT NULL)"
    " UPDATE pointers SET lease_id = NULL,"
    " vesting_ms = coalesce((SELECT min(vesting_ms) FROM firsts), :now)"
    " WHERE zone = :zone AND lease_id = :lease",
)
SQLITE_COMPLETE = "DELETE FROM items WHERE zone = ? AND id = ? AND lease_id = ?"
VISIT_ITEMS = 4  # quick worker --workers 4 visits four items at a time


def quick_drain(url: str, items: int) -> dict[str, float]:
    """``items`` items of one tenant, one ``enqueue`` each, drained by
    ``Consumer.run_until_idle`` with ``ConsumerConfig(workers=4)``: the process's CPU an
    item, items/s, and how many handlers ran (each item once when all is well)."""
    from quickzones.client import Quick
    from quickzones.consumer import ConsumerConfig

    ran_ok: list[None] = []
    own = Quick.open(url)
    try:
        own.job("probe.noop")(lambda payload, ctx: ran_ok.append(None))
        for _ in range(items):
            own.enqueue("probe.noop", {"t": "t0"}, app="a", tenant="t0")
        cpu0, t0 = time.process_time(), time.perf_counter()
        ran = own.consumer(ConsumerConfig(workers=4, seed=1)).run_until_idle()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        own.close()
    return {"items": ran, "ran_ok": len(ran_ok), "cpu_ms": cpu / max(ran, 1) * 1000,
            "items_s": ran / wall}  # fmt: skip


def sqlite_drain(kind: str, folder: Path, q: Any, items: int) -> dict[str, float]:
    """``items`` no-op items of one tenant drained: by ``quick``'s consumer
    (``run_until_idle``, ``ConsumerConfig(workers=4)``: the process's CPU an item), or by
    ``native`` visits of four items and one completion transaction each, on one thread,
    with nothing else of a consumer (the store's work alone: CPU an item, and how long
    each transaction held the write lock)."""
    import sqlite3

    from quickzones.store.records import decode_item

    if kind == "quick":
        return quick_drain(f"sqlite:///{folder / 'quick.db'}", items)
    conn = sqlite3.connect(folder / "native.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for statement in SQLITE_TABLES:
            conn.execute(statement)
        for _ in range(items):
            item = native_args(q, "t0")
            conn.execute("BEGIN IMMEDIATE")
            for statement in SQLITE_ENQUEUE:
                conn.execute(statement, item)
            conn.execute("COMMIT")
        held: list[float] = []
        ran = 0
        cpu0 = time.thread_time()
        while True:
            now = int(time.time() * 1000)
            lease = f"L{ran}"
            args = {"zone": "a/t0", "lease": lease, "now": now, "lease_ms": 30_000,
                    "n": VISIT_ITEMS}  # fmt: skip
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute(SQLITE_VISIT[0], args).fetchone() is None:
                conn.execute("COMMIT")
                break
            rows = conn.execute(SQLITE_VISIT[1], args).fetchall()
            conn.execute(SQLITE_VISIT[2], args)
            conn.execute("COMMIT")
            held.append(time.perf_counter() - t0)
            # What a worker runs: the items decoded (the key only names one in errors).
            leased = [decode_item(b"", record) for _, record in rows]
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(SQLITE_COMPLETE, [("a/t0", i.item_id, lease) for i in leased])
            conn.execute("COMMIT")
            held.append(time.perf_counter() - t0)
            ran += len(leased)
        cpu = time.thread_time() - cpu0
    finally:
        conn.close()
    held.sort()
    return {
        "items": ran,
        "cpu_ms": cpu / max(ran, 1) * 1000,
        "lock_held_p50_ms": held[len(held) // 2] * 1000,
        "lock_held_p99_ms": held[int(len(held) * 0.99)] * 1000,
    }


def sqlite_runs(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-native-sqlite-") as work:
        q = open_quick(f"sqlite:///{Path(work) / 'items.db'}")  # only builds items
        try:
            for r in range(args.runs):
                order = SQLITE_KINDS if r % 2 == 0 else tuple(reversed(SQLITE_KINDS))
                run: dict[str, Any] = {}
                for kind in order:
                    folder = Path(work) / f"r{r}-{kind}"
                    folder.mkdir()
                    run[kind] = sqlite_one_producer(kind, folder, q, args.seconds)
                    log(f"run {r + 1} SQLite one producer {kind}: {run[kind]}")
                for kind in ("quick", "native") if r % 2 == 0 else ("native", "quick"):
                    folder = Path(work) / f"r{r}-drain-{kind}"
                    folder.mkdir()
                    run[f"drain {kind}"] = sqlite_drain(kind, folder, q, args.drain_items)
                    log(f"run {r + 1} SQLite drain {kind}: {run[f'drain {kind}']}")
                runs.append(run)
        finally:
            q.close()
    m = {
        f"one producer {kind} {field}": statistics.median(run[kind][field] for run in runs)
        for kind in SQLITE_KINDS
        for field in ("calls_s", "cpu_ms")
    }
    for kind in ("quick", "native"):
        for field in runs[0][f"drain {kind}"]:
            m[f"drain {kind} {field}"] = statistics.median(
                run[f"drain {kind}"][field] for run in runs
            )
    return {"medians": m, "runs": runs}


def sqlite_table(m: dict[str, float]) -> str:
    huey = m["one producer huey calls_s"]
    rows = [
        "| variant (SQLite) | one producer, calls/s | CPU a call | x Huey |",
        "|---|---|---|---|",
    ]
    for kind in SQLITE_KINDS:
        rate, cpu = m[f"one producer {kind} calls_s"], m[f"one producer {kind} cpu_ms"]
        rows.append(f"| {kind} | {rate:,.0f} | {cpu:.3f} ms | {rate / huey:.2f}x |")
    rows += [
        "",
        "| drain (SQLite) | CPU an item | write lock held a transaction, p50 / p99 |",
        "|---|---|---|",
        f"| quick consumer, workers=4 | {m['drain quick cpu_ms']:.3f} ms | |",
        f"| native visits and completions alone | {m['drain native cpu_ms']:.3f} ms | "
        f"{m['drain native lock_held_p50_ms']:.3f} / {m['drain native lock_held_p99_ms']:.3f} ms |",
    ]
    return "\n".join(rows)


# A visit under row locks at READ COMMITTED, in two round trips. The first: the pointer's
# lease, the items' leases (only where this visit holds the pointer: a statement sees its
# transaction's earlier ones; SKIP LOCKED passes rows another visit is taking), and the
# pointer locked FOR UPDATE unless an enqueue in flight holds it FOR KEY SHARE. The
# second, a new snapshot taken after that lock: the requeue to the zone's next vesting
# time (a loose index scan), or to vest at once when an enqueue is in flight.
PG_VISIT = (
    "UPDATE probe_native.pointers SET lease_id = %(lease)s,"
    " vesting_ms = %(now)s + %(lease_ms)s WHERE zone = %(zone)s AND vesting_ms <= %(now)s",
    "UPDATE probe_native.items SET lease_id = %(lease)s, vesting_ms = %(now)s + %(lease_ms)s,"
    " attempts = attempts + 1 WHERE (zone, id) IN (SELECT zone, id FROM probe_native.items"
    " WHERE zone = %(zone)s AND vesting_ms <= %(now)s AND EXISTS (SELECT 1 FROM"
    " probe_native.pointers WHERE zone = %(zone)s AND lease_id = %(lease)s)"
    " ORDER BY priority, vesting_ms, seq LIMIT %(n)s FOR UPDATE SKIP LOCKED)"
    " RETURNING id, record",
    "SELECT zone FROM probe_native.pointers WHERE zone = %(zone)s FOR UPDATE SKIP LOCKED",
)
PG_REQUEUE = (
    "WITH RECURSIVE firsts(priority, vesting_ms) AS ("
    " (SELECT priority, vesting_ms FROM probe_native.items WHERE zone = %(zone)s"
    " ORDER BY priority, vesting_ms LIMIT 1)"
    " UNION ALL SELECT (SELECT priority FROM probe_native.items WHERE zone = %(zone)s"
    " AND priority > firsts.priority ORDER BY priority, vesting_ms LIMIT 1),"
    " (SELECT vesting_ms FROM probe_native.items WHERE zone = %(zone)s"
    " AND priority > firsts.priority ORDER BY priority, vesting_ms LIMIT 1)"
    " FROM firsts WHERE firsts.priority IS NOT NULL)"
    " UPDATE probe_native.pointers SET lease_id = NULL, vesting_ms = CASE WHEN %(locked)s"
    " THEN coalesce((SELECT min(vesting_ms) FROM firsts), %(now)s) ELSE %(now)s END"
    " WHERE zone = %(zone)s AND lease_id = %(lease)s"
)
PG_COMPLETE = (
    "DELETE FROM probe_native.items"
    " WHERE zone = %(zone)s AND id = ANY(%(ids)s) AND lease_id = %(lease)s"
)


def postgres_drain(kind: str, dsn: str, q: Any, items: int, r: int) -> dict[str, float]:
    """``items`` no-op items of one tenant drained on PostgreSQL: by ``quick``'s
    consumer (``run_until_idle``, ``ConsumerConfig(workers=4)``: the process's CPU an
    item), or by ``native`` visits of four items (:data:`PG_VISIT`, two round trips) and
    one completion each (one round trip), on one thread with nothing else of a consumer:
    the store's work alone, CPU an item and items/s."""
    from quickzones.store.records import decode_item

    if kind == "quick":
        return quick_drain(f"{dsn}?schema=probe_drain_{r}", items)
    zone = f"drain/{r}"
    with _connect(dsn) as conn:
        for _ in range(items):
            item = native_args(q, "t0")
            conn.execute(NATIVE_ENQUEUE, {**item, "zone": zone})
        ran = 0
        cpu0, t0 = time.thread_time(), time.perf_counter()
        while True:
            lease = f"L{r}.{ran}"
            args = {"zone": zone, "lease": lease, "now": int(time.time() * 1000),
                    "lease_ms": 30_000, "n": VISIT_ITEMS}  # fmt: skip
            with conn.pipeline():
                conn.execute("BEGIN")
                conn.execute(PG_VISIT[0], args)
                leased = conn.execute(PG_VISIT[1], args)
                locked = conn.execute(PG_VISIT[2], args)
            rows = leased.fetchall()
            args["locked"] = locked.fetchone() is not None
            with conn.pipeline():
                conn.execute(PG_REQUEUE, args)
                conn.execute("COMMIT")
            if not rows:
                break
            ids = [decode_item(b"", record).item_id for _, record in rows]
            conn.execute(PG_COMPLETE, {"zone": zone, "ids": ids, "lease": lease})
            ran += len(ids)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
    return {"items": ran, "cpu_ms": cpu / max(ran, 1) * 1000, "items_s": ran / wall}


def postgres_runs(args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from bench.servers import postgres_server

    runs: list[dict[str, Any]] = []
    with postgres_server() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(NATIVE_TABLES)
        _create_app_tables(dsn, APP)
        url = f"{dsn}?schema=probe_quick"
        q = open_quick(url)
        try:
            for r in range(args.runs):
                run = one_run(dsn, url, q, r, args)
                for kind in ("quick", "native") if r % 2 == 0 else ("native", "quick"):
                    run[f"drain {kind}"] = postgres_drain(kind, dsn, q, args.drain_items, r)
                    log(f"run {r + 1} PostgreSQL drain {kind}: {run[f'drain {kind}']}")
                runs.append(run)
        finally:
            q.close()
    m = medians(runs)
    for kind in ("quick", "native"):
        for field in runs[0][f"drain {kind}"]:
            m[f"drain {kind} {field}"] = statistics.median(
                run[f"drain {kind}"][field] for run in runs
            )
    return {"medians": m, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native_probe", description=__doc__)
    ap.add_argument(
        "--store",
        type=lambda s: s.split(","),
        default=["postgres", "sqlite"],
        help="postgres, sqlite or both, comma-separated (default both)",
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="each case's length")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--no-procrastinate", dest="procrastinate", action="store_false")
    ap.add_argument("--drain-items", type=int, default=5000, help="SQLite drains' items")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    unknown = set(args.store) - {"postgres", "sqlite"}
    if unknown:
        ap.error(f"--store: unknown {', '.join(sorted(unknown))} (postgres, sqlite)")
    fields: dict[str, Any] = {}
    if "postgres" in args.store:
        fields["postgres"] = postgres_runs(args)
        print(table(fields["postgres"]["medians"]), flush=True)
    if "sqlite" in args.store:
        fields["sqlite"] = sqlite_runs(args)
        print(sqlite_table(fields["sqlite"]["medians"]), flush=True)
    command = "python -m bench.native_probe " + " ".join(sys.argv[1:] if argv is None else argv)
    folder = write_run("native-probe", args.out, command, fields)
    log(f"results in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

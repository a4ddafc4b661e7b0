"""quick on PostgreSQL beside a long transaction: bloat, and small tenants' pickups
(issue 42 point 3).

``python -m bench.pg_long_txn [--rate 500] [--hold 120] [--warmup 20] [--cooldown 120]
[--tuned] [--zones kv|sql] [--statements] [--out DIR]``

On a private PostgreSQL server (:func:`bench.servers.postgres_server`, its defaults:
``autovacuum_naptime`` 1 min, fsync on), items flow at a steady offered ``--rate`` into
``quick worker --workers 4`` with every other setting at its default
(:mod:`bench.user_app`): half of them (``--noisy-share``) from one noisy tenant, written
by ``enqueue_many`` every 100 ms, the rest one ``enqueue`` each into one of
``--small-tenants`` small tenants at random, from a producer process of its own. After
``--warmup`` seconds another connection runs ``BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM <schema>.kv;`` and keeps that snapshot for ``--hold`` seconds (a
report, a session left idle in transaction), then commits; the flow goes on for
``--cooldown`` seconds. ``--holder-database NAME`` holds it in another database of the
same server instead (PostgreSQL keeps row versions for the snapshots of the table's own
database only).

Every ``--every`` seconds (5): the backlog (items enqueued and not started), the small
tenants' pickup p50/p99 of the items started in those seconds (start minus the
producer's call to enqueue), and per quick table ``n_dead_tup``, ``n_live_tup``,
``pg_total_relation_size`` and its indexes' size (``pg_stat_user_tables``). Before the
hold, in it and after the cool-down, ``EXPLAIN (ANALYZE, BUFFERS)`` of the reads on a
pickup's path: a snapshot's first read (its snapshot and the version, from a sequence),
the scanner's range read of vested pointers, a zone peek of a small tenant and of the
noisy one, the point reads of the noisy zone's pointer record and count (rewritten by
each of its visits), the commit watcher's read of the commits it has not seen and a
commit's conflict check (``quick_log``). At the end: whether each table was autovacuumed
after the commit and its dead rows came back to their level before the hold, and whether
pickups did.

``--commits N``: no flow; a snapshot held while N commits add to one key, and every
quarter the buffers of the reads that walk row versions (the key's, a snapshot's first
read, the commit watcher's), then after the snapshot ends and a VACUUM.

``--statements`` starts the server with ``pg_stat_statements`` and reports, for the
warm-up, the hold and the cool-down, the server's milliseconds a second per statement,
with its calls and the buffers a call touched: which of quick's statements a held snapshot
slows, in the flow itself rather than in one EXPLAIN.

``--tuned`` applies :func:`quickzones.backends.postgres.tuning.schema_statements` (the
per-table autovacuum settings) to the schema before the flow starts: the same run with
and without it is the before/after. Prints a table; results in
``bench/results/<UTC timestamp>-pg-long-txn/pg_long_txn.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.common import child_env, log, machine, run_folder
from bench.quickrun import JOB, user_worker_cmd
from quickzones.cli.demo import percentile

NOISY = "noisy"
APP = "b"
TABLES = ("kv", "quick_meta", "quick_log")
# zones=sql's: items and pointers in tables of their own (reported where they exist).
NATIVE_TABLES = ("quick_items", "quick_pointers", "quick_zones")
NOISY_BATCH_EVERY_S = 0.1
# A probe statement that writes: run in a transaction and rolled back.
ROLLED_BACK = "rolled back: "
# sql.py's commits_unseen with = ANY(ARRAY(...)) for its IN (SELECT ...): the form that
# lets PostgreSQL read quick_log's newest rows by its xid index (proposed; {log}: the
# table's quoted name).
PROPOSED_WATCHER = (
    "SELECT pg_current_snapshot()::text, array(SELECT id FROM {log}"
    " WHERE xid >= pg_snapshot_xmax(%s::pg_snapshot)"
    " OR xid = ANY (ARRAY(SELECT pg_snapshot_xip(%s::pg_snapshot))))"
)


# --- the producer (a process of its own: its GIL is not the sampler's or the worker's) ---


def produce(
    url: str, rate: float, noisy_share: float, small_tenants: int, seconds: float, counts: str
) -> None:
    """Enqueue at ``rate`` items/s for ``seconds``: the noisy tenant's share as one
    ``enqueue_many`` every 100 ms, the rest one ``enqueue`` each at even spacing into a
    random small tenant (from several threads, so one slow call does not stall the
    schedule). The
    number enqueued so far is rewritten to ``counts`` every 100 ms."""
    from bench.quickrun import open_quick

    q = open_quick(url)
    start = time.time()
    end = start + seconds
    done = [0, 0]  # small, noisy
    lock = threading.Lock()
    stop = threading.Event()
    small_rate = rate * (1 - noisy_share)
    per_batch = max(1, round(rate * noisy_share * NOISY_BATCH_EVERY_S))
    errors: list[BaseException] = []

    def small(offset: int, step: int) -> None:
        rng = random.Random(offset)
        i = offset
        try:
            while small_rate > 0:
                at = start + i / small_rate
                if at >= end or time.time() >= end:  # a schedule fallen behind ends too
                    return
                delay = at - time.time()
                if delay > 0:
                    time.sleep(delay)
                tenant = f"t{rng.randrange(small_tenants)}"
                t = time.time()
                q.enqueue(JOB, {"t": tenant, "e": t, "d": t}, app=APP, tenant=tenant)
                with lock:
                    done[0] += 1
                i += step
        except BaseException as err:  # reported by the main thread
            errors.append(err)
            stop.set()

    def noisy() -> None:
        j = 0
        try:
            while noisy_share > 0:
                at = start + j * NOISY_BATCH_EVERY_S
                if at >= end or time.time() >= end:
                    return
                delay = at - time.time()
                if delay > 0:
                    time.sleep(delay)
                t = time.time()
                q.enqueue_many(JOB, [{"t": NOISY, "e": t, "d": t}] * per_batch, app=APP,
                               tenant=NOISY)  # fmt: skip
                with lock:
                    done[1] += per_batch
                j += 1
        except BaseException as err:
            errors.append(err)
            stop.set()

    # An enqueue waits on the server's commit (fsync) for a few ms: one thread per 40
    # items/s keeps the schedule.
    n = max(2, math.ceil(small_rate / 40))
    threads = [threading.Thread(target=small, args=(k, n)) for k in range(n)]
    threads.append(threading.Thread(target=noisy))
    for th in threads:
        th.start()

    def write() -> None:
        with lock:
            text = f"{done[0]} {done[1]}"
        Path(counts + ".tmp").write_text(text)
        os.replace(counts + ".tmp", counts)

    while any(th.is_alive() for th in threads) and not stop.is_set():
        write()
        time.sleep(0.1)
    for th in threads:
        th.join()
    write()
    q.close()
    if errors:
        raise errors[0]


def _read_counts(path: Path) -> tuple[int, int]:
    try:
        small, noisy = path.read_text().split()
        return int(small), int(noisy)
    except (OSError, ValueError):
        return 0, 0


# --- what the sampler reads ------------------------------------------------------------

STATS = """SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid),
    pg_indexes_size(relid), autovacuum_count, vacuum_count, last_autovacuum, n_tup_upd,
    n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s"""


def table_stats(conn: Any, schema: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in conn.execute(STATS, (schema,)):
        name, dead, live, total, indexes, autovacuums, vacuums, last, updates, hot = row
        out[name] = {
            "n_dead_tup": int(dead),
            "n_live_tup": int(live),
            "total_bytes": int(total),
            "index_bytes": int(indexes),
            "autovacuum_count": int(autovacuums),
            "vacuum_count": int(vacuums),
            "last_autovacuum": last.timestamp() if last is not None else None,
            # Updates that stayed on their page (HOT): no new index entry.
            "updates": int(updates),
            "hot_updates": int(hot),
        }
    return out


@dataclass
class Records:
    """The handlers' start records (``bench.common.record_start``), read as they grow."""

    path: Path
    offset: int = 0
    started: int = 0
    started_noisy: int = 0
    tail: bytes = b""

    def new(self) -> list[tuple[str, float, float]]:
        """(tenant, enqueued, started) of each record written since the last call."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self.tail + chunk
        lines = data.split(b"\n")
        self.tail = lines.pop()
        out = []
        for line in lines:
            parts = line.split()
            if len(parts) >= 4:
                out.append((parts[0].decode(), float(parts[1]), float(parts[3])))
        self.started += len(out)
        self.started_noisy += sum(1 for tenant, _, _ in out if tenant == NOISY)
        return out


@dataclass
class Probe:
    """The statements of a pickup's path, as the backend sends them (``backends/postgres/
    sql.py``: ``version``, ``range`` with its LIMIT, ``versions_after``), with the key
    ranges the scanner and a zone peek read now, and the point reads of the noisy zone's
    hottest keys."""

    schema: str
    url: str
    small_zone: str = "t0"
    quick: Any = None
    results: list[dict[str, Any]] = field(default_factory=list)

    def statements(self, conn: Any) -> dict[str, tuple[str, tuple[Any, ...]]]:
        from psycopg import sql as pgsql

        from quickzones.clock import now_ms
        from quickzones.consumer import ConsumerConfig
        from quickzones.store.kv import strinc
        from quickzones.store.records import ZoneId

        if self.quick is None:
            from quickzones.client import Quick

            self.quick = Quick.open(self.url)
        q = self.quick
        from quickzones.backends.postgres.sql import Statements

        kv = pgsql.Identifier(self.schema, "kv")
        log_table = pgsql.Identifier(self.schema, "quick_log")
        sql = Statements(self.schema)

        def text(template: str, **names: Any) -> str:
            return pgsql.SQL(template).format(**names).as_string(conn)

        rng = text(
            "SELECT key, value FROM {kv} WHERE key >= %s AND key < %s ORDER BY key LIMIT %s",
            kv=kv,
        )
        now = now_ms(q.clock)
        cfg = ConsumerConfig()
        # Scanner.peek: one shard's vesting entries from its start (the vested ones first).
        begin, _ = q.keys.pointer_vested_range(q.toplevel.cluster, 0, now)
        end = strinc(q.keys.pointer_vesting_prefix(q.toplevel.cluster, 0))
        # A snapshot a few ms old when the reads below run: the commit watcher's (it looks
        # every 5 ms) and a commit's (its reads' snapshot), what they compare quick_log to.
        (snapshot,) = conn.execute(sql.snapshot_now).fetchone()

        def zone(tenant: str) -> tuple[bytes, bytes]:
            z = ZoneId(APP, tenant)
            zb, _ = q.keys.order_range(z)
            return zb, q.keys.order_priority_range(z, 0, now)[1]

        sb, se = zone(self.small_zone)
        nb, ne = zone(NOISY)
        noisy = ZoneId(APP, NOISY)
        get = text("SELECT value FROM {kv} WHERE key = %s", kv=kv)
        pointer = q.toplevel.get_pointer(noisy)
        pointer_key = (
            q.keys.pointer_key(q.toplevel.cluster, q.toplevel.shard_for(noisy), pointer.pointer_id)
            if pointer is not None
            else b""
        )
        if "zones=sql" in self.url:
            return self._native(q, now, cfg, sql, snapshot)
        return {
            # A snapshot's first read: the snapshot and the last commit version (a
            # sequence: rewritten in place, no row versions).
            "read version (sequence)": (sql.read_version, ()),
            "scanner: vested pointers (kv)": (rng, (begin, end, cfg.peek_max + 1)),
            "zone peek, small tenant (kv)": (rng, (sb, se, cfg.dequeue_max)),
            "zone peek, noisy tenant (kv)": (rng, (nb, ne, cfg.dequeue_max)),
            # The noisy zone's two hottest keys: rewritten by each of its visits and
            # enqueues (an UPDATE of one kv row each time).
            "noisy zone's pointer record (kv)": (get, (pointer_key,)),
            "noisy zone's count (kv)": (get, (q.keys.count_key(noisy),)),
            "commit watcher: unseen commits (quick_log)": (
                sql.commits_unseen,
                (snapshot, snapshot),
            ),
            # quick_commit3's check in every commit: the commits its snapshot did not see,
            # against a read range none of them wrote.
            "commit: conflict check (quick_log)": (
                text(
                    "SELECT EXISTS (SELECT 1 FROM {log} c, unnest(c.begins, c.ends) w(b, e),"
                    " unnest(%s::bytea[], %s::bytea[]) r(b, e) WHERE (c.xid >="
                    " pg_snapshot_xmax(%s::pg_snapshot) OR c.xid IN (SELECT"
                    " pg_snapshot_xip(%s::pg_snapshot))) AND w.b < r.e AND r.b < w.e)",
                    log=log_table,
                ),
                ([b"\x00probe"], [b"\x00probe\x00"], snapshot, snapshot),
            ),
            # The same two reads as proposed for sql.py: the OR with a subquery (IN) keeps
            # PostgreSQL off quick_log's xid index, so both read every page of the table,
            # its dead rows' too; = ANY(ARRAY(...)) for the watcher and a UNION ALL of the
            # two index conditions for the check read only the newest rows.
            "commit watcher, proposed (quick_log)": (
                PROPOSED_WATCHER.format(log=log_table.as_string(conn)),
                (snapshot, snapshot),
            ),
            "commit: conflict check, proposed (quick_log)": (
                text(
                    "SELECT EXISTS (SELECT 1 FROM (SELECT begins, ends FROM {log}"
                    " WHERE xid >= pg_snapshot_xmax(%s::pg_snapshot) UNION ALL"
                    " SELECT begins, ends FROM {log} WHERE xid = ANY (ARRAY(SELECT"
                    " pg_snapshot_xip(%s::pg_snapshot)))) c, unnest(c.begins, c.ends) w(b, e),"
                    " unnest(%s::bytea[], %s::bytea[]) r(b, e) WHERE w.b < r.e AND r.b < w.e)",
                    log=log_table,
                ),
                (snapshot, snapshot, [b"\x00probe"], [b"\x00probe\x00"]),
            ),
        }

    def _native(
        self, q: Any, now: int, cfg: Any, sql: Any, snapshot: str
    ) -> dict[str, tuple[str, Any]]:
        """The same path's reads with ``zones=sql``: the scanner's peek of the pointers
        table, a zone's vested items (small tenant, noisy one), the noisy zone's pointer
        row (rewritten by each of its visits), and the commit watcher's read."""
        from quickzones.consumer.selection import longest_wait_ms
        from quickzones.store.records import ZoneId
        from quickzones.store.sql.toplevel import zone_key

        st = q.toplevel.q
        cluster = q.toplevel.cluster
        sql_peek, args, _ = q.toplevel.peek_statement(
            0, cfg.peek_max, ahead_ms=longest_wait_ms(cfg)
        )
        args.pop("clock")
        peek = (sql_peek, args)

        def vested(tenant: str) -> tuple[str, dict[str, Any]]:
            zone = zone_key(ZoneId(APP, tenant))
            return st.vested, {"zone": zone, "upto": now, "n": cfg.dequeue_max}

        return {
            "read version (sequence)": (sql.read_version, ()),
            # The scan's statement (its index range to the consumer's longest sleep), from
            # the shard's start: this process has no floor.
            "scanner: vested pointers (pointers)": peek,
            "zone peek, small tenant (items)": vested(self.small_zone),
            "zone peek, noisy tenant (items)": vested(NOISY),
            "noisy zone's pointer row (pointers)": (
                st.pointer_of_zone,
                {"cluster": cluster, "zone": zone_key(ZoneId(APP, NOISY))},
            ),
            # A small tenant's enqueue as a producer sends it (one statement: the item,
            # the pointer made or pulled), run and rolled back.
            ROLLED_BACK + "an enqueue into a small zone (items, pointers)": (
                st.enqueue_one,
                {
                    "zone": zone_key(ZoneId(APP, self.small_zone)),
                    "id": "probe",
                    "priority": 0,
                    "record": b"probe",
                    **q.toplevel.pointer_args(ZoneId(APP, self.small_zone), now, now),
                },
            ),
            "commit watcher: unseen commits (quick_log)": (
                sql.commits_unseen,
                (snapshot, snapshot),
            ),
        }

    def run(self, dsn: str, label: str, at_s: float) -> dict[str, Any]:
        import psycopg

        one: dict[str, Any] = {"when": label, "at_s": round(at_s, 1), "plans": {}}
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, (sql, params) in self.statements(conn).items():
                if not name.startswith(ROLLED_BACK):
                    one["plans"][name] = explain(conn, sql, params)
                    continue
                conn.execute("BEGIN")
                try:
                    one["plans"][name[len(ROLLED_BACK) :]] = explain(conn, sql, params)
                finally:
                    conn.execute("ROLLBACK")
        self.results.append(one)
        return one

    def close(self) -> None:
        if self.quick is not None:
            self.quick.close()


def explain(conn: Any, sql: str, params: tuple[Any, ...]) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of ``sql``: its time, the shared buffers it read
    (hit or not: what walking dead row versions costs), its rows and plan's nodes."""
    got = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
    assert got is not None
    plan: dict[str, Any] = got[0][0]
    top = plan["Plan"]
    return {
        "ms": round(float(plan["Execution Time"]), 3),
        "buffers": int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
        "rows": int(top.get("Actual Rows", 0)),
        "node": _nodes(top),
        "plan": plan,
    }


def _nodes(plan: dict[str, Any]) -> str:
    """The plan's node types, outermost first (``Limit > Index Scan``)."""
    names = [str(plan["Node Type"])]
    for child in plan.get("Plans", []):
        names.append(_nodes(child))
    return " > ".join(names)


# --- the run ---------------------------------------------------------------------------


@dataclass
class Options:
    rate: float = 500.0
    noisy_share: float = 0.5
    small_tenants: int = 100
    warmup: float = 20.0
    hold: float = 120.0
    cooldown: float = 120.0
    every: float = 5.0
    workers: int = 4
    tuned: bool = False
    synchronous_commit: bool = True
    # Hold the snapshot in this other database of the server ("": the store's own).
    holder_database: str = ""
    # quick's zone layout: "kv" or "sql" (postgresql://...?zones=sql).
    zones: str = "kv"
    # pg_stat_statements per window (the warm-up, the hold, the cool-down): where the
    # server's time went (the server started with the library preloaded).
    statements: bool = False


@contextlib.contextmanager
def _process(
    cmd: list[str], env: dict[str, str], logfile: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with logfile.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(5)


class Statements:
    """The server's time per statement over a window (``pg_stat_statements``, reset at
    each window's start): which of quick's statements a held snapshot slows."""

    TOP = 20

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.began = time.time()

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")
        self.began = time.time()

    def window(self, label: str) -> dict[str, Any]:
        """The window since the last reset (then reset): per statement calls, the
        server's ms a call and in all, the buffers a call touched and the rows a call
        returned or wrote (a lease's: the items a visit took)."""
        rows = self.conn.execute(
            "SELECT query, calls, total_exec_time, shared_blks_hit + shared_blks_read, rows"
            " FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time DESC"
        ).fetchall()
        seconds = time.time() - self.began
        self.reset()
        total = sum(r[2] for r in rows)
        top = [
            {
                "query": " ".join(str(q).split())[:160],
                "calls": calls,
                "ms_a_call": ms / calls,
                "ms": ms,
                "buffers_a_call": blocks / calls,
                "rows_a_call": returned / calls,
            }
            for q, calls, ms, blocks, returned in rows[: self.TOP]
        ]
        rate = total / seconds
        log(f"statements, {label} ({seconds:.0f} s): {rate:.0f} ms of statements a second")
        for one in top[:8]:
            log(
                f"  {one['ms'] / seconds:7.1f} ms/s {one['calls'] / seconds:7.1f}/s"
                f" {one['ms_a_call']:7.3f} ms {one['buffers_a_call']:7.1f} buf"
                f" {one['rows_a_call']:6.1f} rows  {one['query'][:90]}"
            )
        return {"window": label, "seconds": seconds, "ms_a_second": total / seconds, "top": top}


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return percentile(values, 50), percentile(values, 99)


def run(dsn: str, schema: str, opts: Options, work: Path) -> dict[str, Any]:
    """One run on the server ``dsn`` (a fresh ``schema``); the result document."""
    import psycopg
    from psycopg import sql as pgsql

    from bench.quickrun import open_quick

    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={quote(schema)}"
    if opts.zones != "kv":
        url += f"&zones={opts.zones}"
    open_quick(url).close()  # creates the schema
    if not opts.synchronous_commit:
        # Every session opened from now on (the worker's, the producer's): a commit no
        # longer waits for its WAL flush while it holds the resolver's lock.
        with psycopg.connect(dsn, autocommit=True) as conn:
            (database,) = conn.execute("SELECT current_database()").fetchone() or ("",)
            conn.execute(
                pgsql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                    pgsql.Identifier(database)
                )
            )
    if opts.tuned:
        from quickzones.backends.postgres.tuning import schema_statements

        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in schema_statements(schema):
                conn.execute(statement)
    records = Records(work / "records.txt")
    records.path.write_bytes(b"")
    counts = work / "counts.txt"
    env = child_env(BENCH_OUT=str(records.path), QUICK_STORE=url)
    total_s = opts.warmup + opts.hold + opts.cooldown
    producer_cmd = [
        sys.executable,
        "-c",
        "import sys; from bench.pg_long_txn import produce; "
        "produce(sys.argv[1], *map(float, sys.argv[2:4]), int(sys.argv[4]), "
        "float(sys.argv[5]), sys.argv[6])",
        url,
        str(opts.rate),
        str(opts.noisy_share),
        str(opts.small_tenants),
        str(total_s),
        str(counts),
    ]
    probe = Probe(schema, url)
    samples: list[dict[str, Any]] = []
    held: dict[str, float] = {}
    stats_conn = psycopg.connect(dsn, autocommit=True)
    windows: list[dict[str, Any]] = []
    statements = Statements(stats_conn) if opts.statements else None
    holder = _holder(stats_conn, dsn, opts.holder_database)
    try:
        with _process(user_worker_cmd(opts.workers), env, work / "worker.log") as worker:
            # The worker is up once it ran one item.
            q = open_quick(url)
            t = time.time()
            q.enqueue(JOB, {"t": "warmup", "e": t, "d": t}, app=APP, tenant="warmup")
            q.close()
            deadline = time.time() + 60
            while records.path.stat().st_size == 0:
                if worker.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"quick worker did not start: see {work}/worker.log")
                time.sleep(0.05)
            records.new()
            base_started, base_noisy = records.started, records.started_noisy
            with _process(producer_cmd, env, work / "producer.log") as producer:
                t0 = time.time()
                hold_at, commit_at = t0 + opts.warmup, t0 + opts.warmup + opts.hold
                next_sample = t0 + opts.every
                probes_due = [
                    ("before the hold", hold_at - min(2.0, opts.warmup / 2)),
                    ("hold, middle", hold_at + opts.hold / 2),
                    ("hold, end", commit_at - min(2.0, opts.hold / 4)),
                    ("after the cool-down", t0 + total_s - min(2.0, opts.cooldown / 4)),
                ]
                window: list[tuple[str, float, float]] = []
                cpu_at = (time.time(), _cpu_s(worker.pid))
                while True:
                    now = time.time()
                    if not held and now >= hold_at:
                        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                        # The snapshot is taken by the first statement.
                        table = (
                            pgsql.Identifier("pg_catalog", "pg_class")
                            if opts.holder_database
                            else pgsql.Identifier(schema, "kv")
                        )
                        counted = holder.execute(pgsql.SQL("SELECT count(*) FROM {}").format(table))
                        (n,) = counted.fetchone() or (0,)
                        held["at"] = now - t0
                        log(f"holding a snapshot ({n} rows counted) for {opts.hold:g} s")
                        if statements:
                            windows.append(statements.window("warm-up"))
                    if held and "commit" not in held and now >= commit_at:
                        holder.execute("COMMIT")
                        held["commit"] = now - t0
                        log("committed the long transaction")
                        if statements:
                            windows.append(statements.window("hold"))
                    if probes_due and now >= probes_due[0][1]:
                        label, _ = probes_due.pop(0)
                        one = probe.run(dsn, label, now - t0)
                        log(f"EXPLAIN {label}: " + ", ".join(
                            f"{k.split(' (')[0]} {v['ms']:.2f} ms/{v['buffers']} buf"
                            for k, v in one["plans"].items()))  # fmt: skip
                    if now >= next_sample:
                        window += records.new()
                        small = [
                            (s - e) * 1000 for tenant, e, s in window if tenant.startswith("t")
                        ]
                        noisy = [(s - e) * 1000 for tenant, e, s in window if tenant == NOISY]
                        window = []
                        enq_small, enq_noisy = _read_counts(counts)
                        cpu_now = (now, _cpu_s(worker.pid))
                        worker_cores = (cpu_now[1] - cpu_at[1]) / max(1e-9, now - cpu_at[0])
                        cpu_at = cpu_now
                        p50, p99 = _percentiles(small)
                        sample = {
                            "t_s": round(now - t0, 1),
                            "phase": _phase(now, hold_at, commit_at),
                            "enqueued": enq_small + enq_noisy,
                            "started": records.started - base_started,
                            # The counts file is rewritten every 100 ms: never below 0.
                            "backlog": max(
                                0, enq_small + enq_noisy - (records.started - base_started)
                            ),
                            # Whose backlog: the noisy tenant's one zone, or the small ones'.
                            "noisy_backlog": max(
                                0, enq_noisy - (records.started_noisy - base_noisy)
                            ),
                            "small_started": len(small),
                            # The worker process's CPU over the window, in cores: one
                            # process's Python holds at most about one.
                            "worker_cores": round(worker_cores, 3),
                            "small_p50_ms": p50,
                            "small_p99_ms": p99,
                            "noisy_p50_ms": _percentiles(noisy)[0],
                            "tables": table_stats(stats_conn, schema),
                        }
                        samples.append(sample)
                        _print_sample(sample)
                        next_sample += opts.every
                    if now >= t0 + total_s and producer.poll() is not None:
                        break
                    if producer.poll() not in (None, 0):
                        raise RuntimeError(f"the producer failed: see {work}/producer.log")
                    if worker.poll() is not None:
                        raise RuntimeError(f"quick worker exited: see {work}/worker.log")
                    time.sleep(0.05)
        if statements:
            windows.append(statements.window("cool-down"))
    finally:
        with contextlib.suppress(psycopg.Error):
            holder.close()
        probe.close()
    final = table_stats(stats_conn, schema)
    stats_conn.close()
    return {
        "held_s": [held.get("at"), held.get("commit")],
        "samples": samples,
        "explain": probe.results,
        "statements": windows,
        "recovery": recovery(samples, final, held, t0),
    }


def commit_chain(dsn: str, schema: str, commits: int, every: int) -> list[dict[str, Any]]:
    """Controlled, no flow: a snapshot held while ``commits`` quick commits read and add
    to one key; every ``every`` commits, and after the snapshot ends and after a VACUUM, the
    buffers and ms of the reads: the key's (one row version per commit), a snapshot's
    first read and the commit watcher's (``quick_log``)."""
    import psycopg
    from psycopg import sql as pgsql

    from quickzones.backends.postgres.sql import Statements
    from quickzones.backends.postgres.store import PostgresStore
    from quickzones.store.kv import run as run_kv

    store = PostgresStore(dsn, schema=schema)
    key = b"\x01hot-count"
    one = (1).to_bytes(8, "little")

    def add(tr: Any) -> None:
        # A read first, as quick's commits have: a commit with reads lets the store prune
        # quick_log (resolver.prune, from the snapshots its commits read at).
        tr.get(key)
        tr.add(key, one)

    def q(template: str) -> str:
        return pgsql.SQL(template).format(s=pgsql.Identifier(schema)).as_string()

    sql = Statements(schema)
    reads: dict[str, tuple[str, tuple[Any, ...]]] = {
        "the rewritten key (kv)": (q("SELECT value FROM {s}.kv WHERE key = %s"), (key,)),
        "read version (sequence)": (sql.read_version, ()),
    }
    out: list[dict[str, Any]] = []
    with (
        psycopg.connect(dsn, autocommit=True) as probe,
        psycopg.connect(dsn, autocommit=True) as holder,
    ):

        def sample(after: str) -> None:
            row: dict[str, Any] = {"after": after}
            for name, (statement, params) in reads.items():
                row[name] = explain(probe, statement, params)
            (snapshot,) = probe.execute(sql.snapshot_now).fetchone() or ("",)
            row["commit watcher (quick_log)"] = explain(
                probe, sql.commits_unseen, (snapshot, snapshot)
            )
            row["commit watcher, proposed (quick_log)"] = explain(
                probe, PROPOSED_WATCHER.format(log=q("{s}.quick_log")), (snapshot, snapshot)
            )
            out.append(row)
            log(f"after {after}: " + ", ".join(f"{k} {v['buffers']} buf" for k, v in row.items()
                                                if k != "after"))  # fmt: skip

        run_kv(store, add)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute(q("SELECT count(*) FROM {s}.kv"))
        sample("0 commits")
        for i in range(1, commits + 1):
            run_kv(store, add)
            if i % every == 0:
                sample(f"{i} commits")
        holder.execute("COMMIT")
        sample("the snapshot's end")
        for table in TABLES:
            probe.execute(q("VACUUM {s}.") + pgsql.Identifier(table).as_string())
        sample("VACUUM")
    store.close()
    return out


def _holder(admin: Any, dsn: str, database: str) -> Any:
    """The long transaction's connection: to the store's database, or to ``database``
    of the same server (created if absent)."""
    import psycopg
    from psycopg import sql as pgsql

    if not database:
        return psycopg.connect(dsn, autocommit=True)
    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
    if exists.fetchone() is None:
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(database)))
    return psycopg.connect(dsn, autocommit=True, dbname=database)


def _phase(now: float, hold_at: float, commit_at: float) -> str:
    return "warm-up" if now < hold_at else "hold" if now < commit_at else "cool-down"


def recovery(
    samples: list[dict[str, Any]], final: dict[str, Any], held: dict[str, float], t0: float
) -> dict[str, Any]:
    """Per table: dead rows before the hold (the last warm-up sample), at its end, at the
    end of the run; whether autovacuum ran after the commit and dead rows came back to
    at most twice their level before (plus 1,000); the first sample where they did. The
    same for the small tenants' pickup p99 (at most twice the warm-up's worst window)."""
    before = [s for s in samples if s["phase"] == "warm-up"]
    during = [s for s in samples if s["phase"] == "hold"]
    after = [s for s in samples if s["phase"] == "cool-down"]
    out: dict[str, Any] = {"tables": {}}
    commit_wall = t0 + held["commit"] if "commit" in held else None
    for name in [*TABLES, *(n for n in NATIVE_TABLES if n in final)]:
        base = before[-1]["tables"].get(name, {}) if before else {}
        peak = max((s["tables"].get(name, {}).get("n_dead_tup", 0) for s in during), default=0)
        limit = 2 * base.get("n_dead_tup", 0) + 1000
        back = next(
            (s["t_s"] for s in after if s["tables"].get(name, {}).get("n_dead_tup", 0) <= limit),
            None,
        )
        last = final.get(name, {}).get("last_autovacuum")
        out["tables"][name] = {
            "dead_before": base.get("n_dead_tup"),
            "dead_peak_in_hold": peak,
            "dead_at_end": final.get(name, {}).get("n_dead_tup"),
            "bytes_before": base.get("total_bytes"),
            "bytes_at_end": final.get(name, {}).get("total_bytes"),
            "autovacuumed_after_commit": bool(
                last is not None and commit_wall is not None and last >= commit_wall
            ),
            "dead_back_at_s": back,
        }
    base_p99 = max((s["small_p99_ms"] for s in before[1:] if s["small_started"]), default=0.0)
    worst = max((s["small_p99_ms"] for s in during if s["small_started"]), default=float("nan"))
    back_p99 = next(
        (s["t_s"] for s in after if s["small_started"] and s["small_p99_ms"] <= 2 * base_p99),
        None,
    )
    out["pickup"] = {
        "small_p99_before_ms": base_p99,
        "small_p99_worst_in_hold_ms": worst,
        "small_p99_back_at_s": back_p99,
        "backlog_peak": max((s["backlog"] for s in samples), default=0),
        "backlog_at_end": samples[-1]["backlog"] if samples else None,
    }
    return out


def _cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


HEADER = (
    "   t phase      backlog  noisy  cpu  small p50/p99 ms "
    "|  kv dead / MB  | meta dead / MB  | log dead / MB"
)
NATIVE_HEADER = " | items dead / MB | pointers dead / MB"


def _print_sample(s: dict[str, Any]) -> None:
    tb = s["tables"]
    native = [n for n in NATIVE_TABLES if n in tb]
    if s["t_s"] <= 5.5:
        print(HEADER + (NATIVE_HEADER if native else ""), flush=True)

    def cell(name: str) -> str:
        one = tb.get(name, {})
        return f"{one.get('n_dead_tup', 0):>8} {_mb(one.get('total_bytes')):>6}"

    print(
        f"{s['t_s']:>5.0f} {s['phase']:<10} {s['backlog']:>6} {s.get('noisy_backlog', 0):>6} "
        f"{s.get('worker_cores', 0):>4.2f} "
        f"{s['small_p50_ms']:>7.1f} {s['small_p99_ms']:>7.1f} | {cell('kv')} | "
        f"{cell('quick_meta')} | {cell('quick_log')}" + "".join(f" | {cell(n)}" for n in native),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_long_txn", description=__doc__)
    d = Options()
    ap.add_argument("--rate", type=float, default=d.rate, help="offered items/s")
    ap.add_argument("--noisy-share", type=float, default=d.noisy_share)
    ap.add_argument("--small-tenants", type=int, default=d.small_tenants)
    ap.add_argument("--warmup", type=float, default=d.warmup)
    ap.add_argument("--hold", type=float, default=d.hold, help="seconds the snapshot is held")
    ap.add_argument("--cooldown", type=float, default=d.cooldown)
    ap.add_argument("--every", type=float, default=d.every, help="seconds between samples")
    ap.add_argument("--workers", type=int, default=d.workers, help="quick worker --workers")
    ap.add_argument(
        "--tuned",
        action="store_true",
        help="apply backends/postgres/tuning.py's per-table autovacuum settings first",
    )
    ap.add_argument(
        "--no-synchronous-commit",
        action="store_true",
        help="synchronous_commit=off for the run's sessions (commits stop waiting on fsync: "
        "a slow disk no longer bounds the rate)",
    )
    ap.add_argument(
        "--holder-database",
        default="",
        help="hold the snapshot in this other database of the same server (created)",
    )
    ap.add_argument(
        "--zones", choices=("kv", "sql"), default="kv", help="quick's zone layout (kv or sql)"
    )
    ap.add_argument(
        "--commits",
        type=int,
        default=0,
        help="instead of the flow: this many commits beside a held snapshot, reads EXPLAINed"
        " every quarter (commit_chain)",
    )
    ap.add_argument(
        "--statements",
        action="store_true",
        help="report pg_stat_statements per window (warm-up, hold, cool-down): where the"
        " server's time went",
    )
    ap.add_argument("--out", default="", help="results directory")
    args = ap.parse_args(argv)
    opts = Options(
        rate=args.rate,
        noisy_share=args.noisy_share,
        small_tenants=args.small_tenants,
        warmup=args.warmup,
        hold=args.hold,
        cooldown=args.cooldown,
        every=args.every,
        workers=args.workers,
        tuned=args.tuned,
        synchronous_commit=not args.no_synchronous_commit,
        holder_database=args.holder_database,
        zones=args.zones,
        statements=args.statements,
    )
    from bench.servers import postgres_server

    if args.commits:
        with postgres_server() as dsn:
            chain = commit_chain(dsn, "pglong_chain", args.commits, max(1, args.commits // 4))
        out = run_folder("pg-long-txn-commits", args.out)
        doc = {
            "command": "python -m bench.pg_long_txn " + " ".join(argv or sys.argv[1:]),
            "machine": machine(),
            "loadavg": os.getloadavg(),
            "samples": chain,
        }
        (out / "pg_long_txn_commits.json").write_text(json.dumps(doc, indent=1))
        names = [k for k in chain[0] if k != "after"]
        print("| after | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
        for row in chain:
            cells = [f"{row[n]['buffers']} ({row[n]['ms']:.2f} ms)" for n in names]
            print(f"| {row['after']} | " + " | ".join(cells) + " |")
        log(f"results in {out}")
        return 0
    preload = ["shared_preload_libraries=pg_stat_statements"] if opts.statements else []
    with (
        postgres_server(preload) as dsn,
        tempfile.TemporaryDirectory(prefix="bench-pglong-") as tmp,
    ):
        result = run(dsn, f"pglong_{os.getpid()}", opts, Path(tmp))
    doc = {
        "command": "python -m bench.pg_long_txn " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "loadavg": os.getloadavg(),
        "options": vars(opts),
        **result,
    }
    out = run_folder("pg-long-txn", args.out)
    (out / "pg_long_txn.json").write_text(json.dumps(doc, indent=1, default=str))
    _print_summary(doc)
    log(f"results in {out}")
    return 0


def _print_summary(doc: dict[str, Any]) -> None:
    print("\nEXPLAIN (ANALYZE, BUFFERS): ms / shared buffers")
    labels = [e["when"] for e in doc["explain"]]
    print("| statement | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    names = list(doc["explain"][0]["plans"]) if doc["explain"] else []
    for name in names:
        cells = [
            f"{e['plans'][name]['ms']:.2f} / {e['plans'][name]['buffers']}" for e in doc["explain"]
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rec = doc["recovery"]
    print("\n| table | dead before | dead peak (hold) | dead at end | MB before | MB at end |"
          " autovacuumed after commit | dead back at t= |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rec["tables"].items():
        print(
            f"| {name} | {r['dead_before']} | {r['dead_peak_in_hold']} | {r['dead_at_end']} | "
            f"{_mb(r['bytes_before'])} | {_mb(r['bytes_at_end'])} | "
            f"{'yes' if r['autovacuumed_after_commit'] else 'no'} | {r['dead_back_at_s']} |"
        )
    p = rec["pickup"]
    print(
        f"\nsmall tenants' pickup p99: {p['small_p99_before_ms']:.1f} ms before the hold, "
        f"worst {p['small_p99_worst_in_hold_ms']:.1f} ms in it, back (<= 2x) at "
        f"t={p['small_p99_back_at_s']}; backlog peak {p['backlog_peak']}, at the end "
        f"{p['backlog_at_end']}"
    )


if __name__ == "__main__":
    sys.exit(main())

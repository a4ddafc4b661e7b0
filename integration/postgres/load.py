"""A producer-consumer load on a private PostgreSQL for the exactly-once fault tests
(``test_pg_exactly_once.py``), every part a real process:

- producers: ``plain`` ones call ``Quick.enqueue``; ``app`` ones open their own psycopg
  transaction, INSERT a row into the application's table, ``Quick.enqueue_on`` the item
  in that transaction and COMMIT. Each enqueue's payload carries a tag naming the call
  (``p0-17``). A producer logs ``ack TAG ID`` once the call (for ``app``, the COMMIT)
  returned, ``raised TAG ID|? ERROR`` when it raised; it stops at a stop file.
- consumers: ``quick worker`` processes running one transactional handler, which adds 1
  to ``fx/id/<item id>`` and to ``fx/tag/<tag>`` in the handler's own transaction, the
  one that completes the item; a handler run whose completion fails leaves no effect.
  Each run is also logged outside the transaction (``runs``), to count reruns.

:class:`Tally` reads what happened and says what was lost or doubled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from quickzones.client import Quick
from quickzones.store.kv import KVTransaction, run, unpack_i64

APP = "shop"
TENANTS = 4
# A producer's enqueues are bounded even if nobody writes its stop file.
MAX_ENQUEUES = 3000
QUICK = Path(sys.executable).with_name("quick")

PRODUCER = textwrap.dedent(
    """
    import os, sys, time
    from quickzones.client import Quick

    url, db, mode, name, log_path, stop_path, table = sys.argv[1:8]
    limit, pace, tenants = int(sys.argv[8]), float(sys.argv[9]), int(sys.argv[10])
    q = Quick.open(url)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def say(*words):
        os.write(fd, (" ".join(words) + "\\n").encode())  # one write: a whole line

    say("open", f"{time.time():.3f}")
    conn = None
    for seq in range(limit):
        if os.path.exists(stop_path):
            break
        tag, item, began = f"{name}-{seq}", "?", time.monotonic()
        payload, tenant = {"tag": tag}, f"t{seq % tenants}"
        try:
            if mode == "plain":
                item = q.enqueue("fx", payload, app="APP", tenant=tenant)
            else:
                import psycopg

                if conn is None:
                    conn = psycopg.connect(db, connect_timeout=2)
                conn.execute(f"INSERT INTO {table} (tag) VALUES (%s)", (tag,))
                item = q.enqueue_on(conn, "fx", payload, app="APP", tenant=tenant)
                conn.commit()  # the row and the item together, or neither
            say("ack", tag, item, f"{time.monotonic() - began:.3f}", f"{time.time():.3f}")
        except Exception as err:  # the fault's doing: log it and go on
            say("raised", tag, item, type(err).__name__, f"{time.monotonic() - began:.3f}")
            print(f"{tag}: {err!r}"[:400], file=sys.stderr)
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
                conn = None
            time.sleep(0.05)
        time.sleep(pace)
    say("done", f"{time.time():.3f}")
    """
).replace('"APP"', repr(APP))

HANDLERS = textwrap.dedent(
    """
    import os
    from quickzones import Quick

    quick = Quick.open({url!r})
    runs = os.open({runs!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    ONE = (1).to_bytes(8, "little")

    @quick.job("fx", transactional=True)
    def fx(payload, ctx):
        os.write(runs, (ctx.item_id + "\\n").encode())  # every run, committed or not
        # The effect: committed with the item's completion, or not at all.
        ctx.tr.add(b"fx/id/" + ctx.item_id.encode(), ONE)
        ctx.tr.add(b"fx/tag/" + payload["tag"].encode(), ONE)
    """
)


class Load:
    """``producers`` (name -> "plain" or "app") and ``workers`` ``quick worker`` processes
    on the store ``url``; ``db`` is the database URL the app producers connect to, with
    their rows in ``table``."""

    def __init__(
        self,
        folder: Path,
        url: str,
        db: str,
        table: str,
        producers: dict[str, str],
        workers: int,
        pace_s: float = 0.01,
    ) -> None:
        self.folder, self.url, self.table = folder, url, table
        self.stop_file = folder / "stop"
        self.runs = folder / "runs"
        self.runs.touch()
        (folder / "handlers.py").write_text(HANDLERS.format(url=url, runs=str(self.runs)))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("QUICK_STORE", None)
        worker = [str(QUICK), "worker", "--app-module", "handlers", "--workers", "4",
                  "--managers", "2", "--lease", "2", "--shutdown-deadline", "2"]  # fmt: skip
        self.workers = [self._spawn(f"worker-{n}", worker, env) for n in range(workers)]
        env = {**env, "PYTHONPATH": os.getcwd()}
        self.producers = {
            name: self._spawn(
                f"producer-{name}", self._producer_argv(url, db, mode, name, table, pace_s), env
            )
            for name, mode in producers.items()
        }
        self.modes = dict(producers)

    def _producer_argv(
        self, url: str, db: str, mode: str, name: str, table: str, pace_s: float
    ) -> list[str]:
        log, stop = str(self._log(name)), str(self.stop_file)
        limits = [str(MAX_ENQUEUES), str(pace_s), str(TENANTS)]
        return [sys.executable, "-c", PRODUCER, url, db, mode, name, log, stop, table, *limits]

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """``argv`` in the load's folder, its output in ``<name>.out``."""
        out = os.open(self.folder / f"{name}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            return subprocess.Popen(
                argv, cwd=self.folder, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        finally:
            os.close(out)

    def _log(self, name: str) -> Path:
        return self.folder / f"acks-{name}"

    def lines(self) -> list[list[str]]:
        """Every producer's log lines, split into words."""
        return [
            line.split()
            for name in self.producers
            if self._log(name).exists()
            for line in self._log(name).read_text().splitlines()
        ]

    def ready(self) -> bool:
        """Every process is working: each producer had an enqueue acknowledged, each
        worker opened the store and printed its banner. A fault before that would test
        how a process starts, not how it rides through."""
        acked = {words[1].rsplit("-", 1)[0] for words in self.lines() if words[0] == "ack"}
        return acked == set(self.producers) and all(
            "quick worker " in self._output(f"worker-{n}") for n in range(len(self.workers))
        )

    def _output(self, name: str) -> str:
        return (self.folder / f"{name}.out").read_text(errors="replace")

    def finished(self) -> bool:
        """Every producer stopped at its stop file (said "done") and exited cleanly."""
        said = all(
            self._log(name).exists() and "\ndone " in self._log(name).read_text()
            for name in self.producers
        )
        return said and all(proc.returncode == 0 for proc in self.producers.values())

    def acked(self) -> int:
        return sum(1 for words in self.lines() if words[0] == "ack")

    def stop_producers(self, timeout: float = 60.0) -> None:
        """Ask them to stop after their current call; they finish it first."""
        self.stop_file.touch()
        for proc in self.producers.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop_file.touch()
        procs = [*self.producers.values(), *self.workers]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def workers_alive(self) -> bool:
        return all(proc.poll() is None for proc in self.workers)

    def worker_output(self) -> str:
        return "\n".join(self._output(f"worker-{n}")[-3000:] for n in range(len(self.workers)))


@dataclass
class Tally:
    """What the producers were told, what the handlers committed, what the application's
    table holds; read once the load has stopped."""

    acked: dict[str, str] = field(default_factory=dict)  # tag -> item id
    raised: dict[str, str] = field(default_factory=dict)  # tag -> item id or "?"
    errors: Counter[str] = field(default_factory=Counter)
    by_id: dict[str, int] = field(default_factory=dict)  # committed effects per item id
    by_tag: dict[str, int] = field(default_factory=dict)  # and per enqueue call
    rows: set[str] = field(default_factory=set)  # the app producers' committed rows
    app_tags: set[str] = field(default_factory=set)  # tags the app producers tried
    runs: int = 0  # handler runs, committed or not
    slowest: float = 0.0  # the longest acknowledged call, seconds

    @classmethod
    def read(cls, load: Load, q: Quick, db: str) -> Tally:
        t = cls()
        for words in load.lines():
            if words[0] == "ack":
                t.acked[words[1]] = words[2]
                t.slowest = max(t.slowest, float(words[3]))
            elif words[0] == "raised":
                t.raised[words[1]] = words[2]
                t.errors[words[3]] += 1
        t.by_id = _counts(q, b"fx/id/")
        t.by_tag = _counts(q, b"fx/tag/")
        t.runs = len(load.runs.read_text().split())
        app = {name for name, mode in load.modes.items() if mode == "app"}
        t.app_tags = {tag for tag in [*t.acked, *t.raised] if tag.rsplit("-", 1)[0] in app}
        if app:
            import psycopg

            with psycopg.connect(db, autocommit=True) as conn:
                t.rows = {r[0] for r in conn.execute(f"SELECT tag FROM {load.table}")}
        return t

    def lost(self) -> set[str]:
        """Acknowledged enqueues whose effect never committed."""
        return {tag for tag in self.acked if tag not in self.by_tag}

    def doubled(self) -> dict[str, int]:
        """Items, or enqueue calls, whose effect committed more than once."""
        return {
            **{f"id {k}": n for k, n in self.by_id.items() if n != 1},
            **{f"tag {k}": n for k, n in self.by_tag.items() if n != 1},
        }

    def unexplained(self) -> set[str]:
        """Effects of no enqueue any producer made (neither acknowledged nor raised)."""
        return set(self.by_tag) - set(self.acked) - set(self.raised)

    def landed(self) -> set[str]:
        """Calls that raised and committed all the same (a COMMIT whose answer was lost)."""
        return set(self.raised) & set(self.by_tag)

    def split(self) -> tuple[set[str], set[str]]:
        """The app producers' rows without an effect, and effects without a row: the row
        and the item commit together or not at all."""
        effects = {tag for tag in self.by_tag if tag in self.app_tags}
        return self.rows - effects, effects - self.rows

    def figures(self, took: float) -> str:
        return (
            f"{len(self.acked)} acked ({len(self.app_tags & set(self.acked))} through"
            f" enqueue_on), "
            f"slowest {self.slowest:.1f} s; {len(self.raised)} raised {dict(self.errors)}, of"
            f" which {len(self.landed())} committed all the same; {len(self.by_id)} effects,"
            f" {self.runs} handler runs; lost {len(self.lost())}, doubled"
            f" {len(self.doubled())}; {took:.1f} s"
        )


def _counts(q: Quick, prefix: bytes) -> dict[str, int]:
    def read(tr: KVTransaction) -> list[tuple[bytes, bytes]]:
        return tr.get_range(prefix, prefix[:-1] + b"0", snapshot=True)

    return {k[len(prefix) :].decode(): unpack_i64(v) for k, v in run(q.kv, read)}


def drained(q: Quick) -> bool:
    """No item left in any of the load's zones."""
    return all(q.zones.count(q.zone(APP, f"t{n}")) == 0 for n in range(TENANTS))

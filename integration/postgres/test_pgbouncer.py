"""quick behind PgBouncer in transaction pooling mode (issue 42 point 2), from the user's
side: Debian's ``pgbouncer`` in front of the session's PostgreSQL
(``quickzones.testing.provision.pgbouncer``), every store URL through it.

In that mode each transaction may run on another server session, so what assumes one
session per connection breaks: LISTEN (the listening session is handed to other clients
between statements; PgBouncer drops a notification that arrives while it is idle, "got
packet 'A' from server when not linked"), session settings and locks, and before
PgBouncer 1.21 server-side prepared statements. Producers and consumers must still work,
nothing lost or run twice, and an idle consumer must still hear of another process's
enqueue, by polling, said once in the log.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.errors import InvalidStoreURL
from quickzones.registry import JobContext
from quickzones.store.kv import KVTransaction, run, unpack_i64
from quickzones.testing.provision.errors import ServiceUnavailable
from quickzones.testing.provision.pgbouncer import LocalPgBouncer, pgbouncer_skip_reason
from quickzones.testing.provision.postgres import postgres_skip_reason, shared_postgres_url
from quickzones.testing.provision.process import terminate_all
from tests.postgres import postgres_store_url
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")
# An idle consumer that would scan again only after an hour, and renew its scanner
# election (the signalled wait's safety poll, a third of this) after 100 s: an enqueue
# from another store object is found within the tests' deadlines only by the commit
# watcher, which behind PgBouncer must poll.
HOUR = 3600.0
ELECTION_TTL_S = 300.0
# The line the store says, once, when it wakes on commits by polling.
POLLING = "polling"


@pytest.fixture(scope="module")
def bouncer() -> Iterator[LocalPgBouncer]:
    try:
        reason = postgres_skip_reason() or pgbouncer_skip_reason()
    except ServiceUnavailable as err:  # QUICK_REQUIRE_POSTGRES set, and one is missing
        pytest.fail(str(err), pytrace=False)
    if reason is not None:
        pytest.skip(reason)
    with LocalPgBouncer(shared_postgres_url()) as started:
        assert isinstance(started, LocalPgBouncer)
        yield started


def through(bouncer: LocalPgBouncer, **options: str) -> str:
    """A store URL with a schema no other test uses (dropped at the session's end),
    reaching the server through ``bouncer``; ``options`` added to its query."""
    direct = urlsplit(postgres_store_url())
    query = "&".join([direct.query, *(f"{k}={v}" for k, v in options.items())])
    netloc = f"{bouncer.user}@{urlsplit(bouncer.url).netloc.split('@')[-1]}"
    return urlunsplit((direct.scheme, netloc, direct.path, query, ""))


@pytest.fixture(params=["kv", "sql"])
def zones(request: pytest.FixtureRequest) -> dict[str, str]:
    """The store URL options of each zone layout: the KV one and zones=sql."""
    return {"zones": "sql"} if request.param == "sql" else {}


def test_producers_in_threads_and_run_until_idle_lose_nothing_and_run_nothing_twice(
    bouncer: LocalPgBouncer, zones: dict[str, str]
) -> None:
    url = through(bouncer, **zones)
    enqueued: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        # Each thread its own store object (its own pooled connections), as web processes.
        try:
            with Quick.open(url) as q:
                # Past psycopg's prepare threshold (5 executions of one statement).
                ids = [q.enqueue("j", {"n": i}, app="a", tenant=f"t{i % 4}") for i in range(30)]
                ids += q.enqueue_many("j", [{"m": i} for i in range(10)], app="a", tenant=f"m{n}")
            with lock:
                enqueued.extend(ids)
        except BaseException as err:  # reported by the test thread
            failures.append(err)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    assert len(enqueued) == 160

    ran: Counter[str] = Counter()
    with Quick.open(url) as q:

        @q.job("j")
        def j(payload: Any, ctx: JobContext) -> None:
            ran[ctx.item_id] += 1

        drained = 0
        while len(ran) < len(enqueued) and drained < 20:
            q.run_until_idle()
            drained += 1
        assert set(ran) == set(enqueued), f"lost {len(set(enqueued) - set(ran))}"
        assert max(ran.values()) == 1, [i for i, c in ran.items() if c > 1]
        assert q.run_until_idle() == 0  # nothing left behind


def test_an_idle_consumer_hears_of_enqueues_by_polling_and_says_so_once(
    bouncer: LocalPgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quick.postgres")
    url = through(bouncer)
    q = Quick.open(url)
    other = Quick.open(url)  # another process's enqueues: only the commit watcher tells
    ran: list[str] = []

    @q.job("j")
    def j(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if POLLING in r.getMessage()]

    consumer = q.consumer(ConsumerConfig(idle_sleep_s=HOUR, election_ttl_s=ELECTION_TTL_S))
    consumer.start()
    try:
        for n in range(6):
            item = other.enqueue("j", b"", app="a", tenant=f"t{n}")
            assert wait_for(lambda item=item: item in ran, timeout=30), (
                f"enqueue {n} from another store object not picked up by an idle consumer"
                " behind PgBouncer: it waits for a NOTIFY that never comes"
            )
            if n == 2:
                # The listening connection's probe heard nothing: it says so, once.
                assert wait_for(lambda: bool(said()), timeout=30), "never said it polls"
    finally:
        consumer.stop()
        q.close()
        other.close()
    assert len(said()) == 1, said()
    assert q.kv.listens == 1  # type: ignore[attr-defined]  # tried once, never again


def test_listen_off_never_listens_and_the_consumer_polls(
    bouncer: LocalPgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quick.postgres")
    url = through(bouncer, listen="off")
    q = Quick.open(url)
    other = Quick.open(url)
    ran: list[str] = []

    @q.job("j")
    def j(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    consumer = q.consumer(ConsumerConfig(idle_sleep_s=HOUR, election_ttl_s=ELECTION_TTL_S))
    consumer.start()
    try:
        for n in range(3):
            item = other.enqueue("j", b"", app="a", tenant=f"t{n}")
            assert wait_for(lambda item=item: item in ran, timeout=30), f"enqueue {n}"

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if POLLING in r.getMessage()]

        # Said at the first wait of the idle consumer's watcher: on a loaded host the three
        # pickups can all come before it (CI under load: none said yet at the stop).
        assert wait_for(lambda: said(), timeout=30)
        assert q.kv.listens == 0  # type: ignore[attr-defined]
    finally:
        consumer.stop()
        q.close()
        other.close()
    assert len(said()) == 1, said()


def test_listen_option_values_are_checked(bouncer: LocalPgBouncer) -> None:
    with pytest.raises(InvalidStoreURL, match="listen"):
        Quick.open(through(bouncer, listen="sometimes"))


def test_enqueue_on_an_application_connection_through_pgbouncer(
    bouncer: LocalPgBouncer, zones: dict[str, str]
) -> None:
    import psycopg

    url = through(bouncer, **zones)
    q = Quick.open(url)
    ran: list[str] = []

    @q.job("j")
    def j(payload: Any, ctx: JobContext) -> None:
        ran.append(ctx.item_id)

    # Server-side prepared statements off, as behind PgBouncer before 1.21 they must be
    # (docs/backends.md, "Behind PgBouncer").
    app_url = urlunsplit(urlsplit(url)._replace(query=""))
    ids: list[str] = []
    with psycopg.connect(app_url, prepare_threshold=None) as conn:
        for n in range(8):
            with conn.transaction():
                ids.append(q.enqueue_on(conn, "j", {"n": n}, app="a", tenant=f"t{n % 2}"))
    q.run_until_idle()
    assert sorted(ran) == sorted(ids)
    q.close()


WORKER_APP = textwrap.dedent(
    """
    import os
    from quickzones import Quick

    quick = Quick.open(os.environ["QUICK_TEST_URL"])
    _fd = os.open(os.environ["QUICK_TEST_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    @quick.job("alo")
    def alo(payload, ctx):
        os.write(_fd, (ctx.item_id + "\\n").encode())

    @quick.job("tx", transactional=True)
    def tx(payload, ctx):
        # Committed with the item's completion, or not at all.
        ctx.tr.add(b"ran/" + ctx.item_id.encode(), (1).to_bytes(8, "little"))
    """
)

PRODUCER = textwrap.dedent(
    """
    import sys
    from quickzones import Quick

    url, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    ids = []
    with Quick.open(url) as q:
        for i in range(40):
            kind = "tx" if i % 4 == 0 else "alo"
            ids.append(kind + " " + q.enqueue(kind, {"i": i}, app="a", tenant=f"{name}-{i % 5}"))
        for item in q.enqueue_many("alo", [{"m": m} for m in range(20)], app="b", tenant=name):
            ids.append("alo " + item)
    with open(out, "w") as f:
        f.write("\\n".join(ids) + "\\n")
    """
)


def test_quick_worker_processes_and_producer_processes_through_pgbouncer(
    bouncer: LocalPgBouncer, tmp_path: Path
) -> None:
    url = through(bouncer)
    Quick.open(url).close()  # the schema, made once before the processes race to
    (tmp_path / "pgb_app.py").write_text(WORKER_APP)
    log = tmp_path / "ran.txt"
    env = {**os.environ, "QUICK_TEST_URL": url, "QUICK_TEST_LOG": str(log)}
    env.pop("QUICK_STORE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "wb") as out:
        worker = subprocess.Popen(
            [str(QUICK), "worker", "--app-module", "pgb_app", "--processes", "2",
             "--workers", "4", "--shutdown-deadline", "5"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        producers = [
            subprocess.Popen(
                [sys.executable, "-c", PRODUCER, url, f"p{n}", str(tmp_path / f"ids{n}.txt")],
                cwd=tmp_path,
                env=env,
            )
            for n in range(3)
        ]
        for p in producers:
            assert p.wait(timeout=300) == 0
        enqueued = [
            line.split()
            for n in range(3)
            for line in (tmp_path / f"ids{n}.txt").read_text().splitlines()
        ]
        alo = {item for kind, item in enqueued if kind == "alo"}
        tx = {item for kind, item in enqueued if kind == "tx"}
        assert len(alo) + len(tx) == 180

        def alo_ran() -> Counter[str]:
            return Counter(log.read_text().split()) if log.exists() else Counter()

        with Quick.open(url) as q:

            def tx_counts(tr: KVTransaction) -> dict[str, int]:
                return {i: unpack_i64(v) if (v := tr.get(b"ran/" + i.encode())) else 0 for i in tx}

            def done() -> bool:
                return set(alo_ran()) >= alo and 0 not in run(q.kv, tx_counts).values()

            assert wait_for(done, timeout=120), worker_log.read_text()[-3000:]
            ran = alo_ran()
            assert set(ran) == alo and max(ran.values()) == 1, ran.most_common(3)
            assert set(run(q.kv, tx_counts).values()) == {1}
    finally:
        terminate_all([worker])
    text = worker_log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert text.count(POLLING) <= 2, text[-3000:]  # once per consumer process at most


def test_enqueue_on_a_connection_with_psycopgs_default_prepare_threshold(
    bouncer: LocalPgBouncer, zones: dict[str, str]
) -> None:
    # quick's statements on the application's connection were prepared by psycopg after
    # 5 executions (prepare_threshold) on one server session; PgBouncer before 1.21
    # (Debian 12 has 1.18) ran the next transaction on another: KVError "prepared
    # statement "_pg3_0" does not exist" (main 9038ee5 executes them with prepare=False).
    import psycopg

    url = through(bouncer, **zones)
    app_url = urlunsplit(urlsplit(url)._replace(query=""))
    ids: list[str] = []
    with (
        Quick.open(url) as q,
        psycopg.connect(app_url) as conn,
        psycopg.connect(app_url, autocommit=True, prepare_threshold=None) as other,
    ):
        for n in range(12):
            with conn.transaction():
                ids.append(q.enqueue_on(conn, "j", {"n": n}, app="a", tenant="t"))
            # Another client holds the server session conn's transaction just ran on
            # (PgBouncer lends the last one returned), so conn's next transaction runs
            # on another session, as under any load.
            other.execute("BEGIN")
            other.execute("SELECT 1")
            with conn.transaction():
                ids.append(q.enqueue_on(conn, "j", {"n": n}, app="a", tenant="u"))
            other.execute("COMMIT")
        ran: list[str] = []
        q.job("j")(lambda payload, ctx: ran.append(ctx.item_id))
        q.run_until_idle()
        assert sorted(ran) == sorted(ids)


def test_a_store_whose_prepared_statements_stay_behind_falls_back_once_and_loses_nothing(
    bouncer: LocalPgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    """quick prepares its statements on its own connections; PgBouncer before 1.21 runs
    the next transaction on another server session, which has none of them. The store
    says so once, sends them unprepared from then on, and every enqueue is stored once."""
    import psycopg

    caplog.set_level(logging.WARNING, logger="quick.postgres")
    url = through(bouncer)
    app_url = urlunsplit(urlsplit(url)._replace(query=""))
    ids: list[str] = []
    with Quick.open(url) as q, psycopg.connect(app_url, autocommit=True) as other:
        for n in range(12):
            ids.append(q.enqueue("j", {"n": n}, app="a", tenant=f"t{n % 3}"))
            # Hold the server session the enqueue ran on, so the next runs on another.
            other.execute("BEGIN")
            other.execute("SELECT 1")
            ids.append(q.enqueue("j", {"n": n}, app="a", tenant=f"u{n % 3}"))
            other.execute("COMMIT")
        assert not q.kv.preparing.on  # type: ignore[attr-defined]
        ran: Counter[str] = Counter()

        @q.job("j")
        def j(payload: Any, ctx: JobContext) -> None:
            ran[ctx.item_id] += 1

        q.run_until_idle()
        assert set(ran) == set(ids) and len(ids) == 24
        assert max(ran.values()) == 1
    said = [r.getMessage() for r in caplog.records if "unprepared" in r.getMessage()]
    assert len(said) == 1, said


def test_prepare_option_values_are_checked(bouncer: LocalPgBouncer) -> None:
    with pytest.raises(InvalidStoreURL, match="prepare"):
        Quick.open(through(bouncer, prepare="always"))
    with Quick.open(through(bouncer, prepare="off")) as q:
        assert not q.kv.preparing.on  # type: ignore[attr-defined]
        q.enqueue("j", b"", app="a", tenant="t")


STARTS_A_BOUNCER = textwrap.dedent(
    """
    import sys, time
    from quickzones.testing.provision.pgbouncer import LocalPgBouncer

    # No server behind it: PgBouncer connects to one only when a client comes.
    bouncer = LocalPgBouncer("postgresql://postgres@127.0.0.1:9/postgres").start()
    print(bouncer.pid, flush=True)
    time.sleep(600)
    """
)


def test_pgbouncer_dies_with_a_test_run_that_is_killed(bouncer: LocalPgBouncer) -> None:
    # A test run killed (kill -9, a CI timeout) runs no cleanup: the kernel's parent-death
    # signal must end the PgBouncer it started, as it ends the PostgreSQL and Redis.
    run = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_BOUNCER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert run.stdout is not None
        pid = int(run.stdout.readline())
        assert os.path.exists(f"/proc/{pid}")
    finally:
        run.kill()
        run.wait(timeout=30)

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: dead
        except OSError:
            return True

    lingered = not wait_for(gone, timeout=30)
    if lingered:
        os.kill(pid, 9)
    assert not lingered, f"pgbouncer {pid} outlived the killed process that started it"

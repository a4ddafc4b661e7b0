"""The Django tasks backend (issue 30 point 3), from a Django user's side: a tiny project
(tests/django_project) whose ``@task`` functions are enqueued through quick into the zone
of the tenant their ``customer`` keyword names, run by a real ``quick worker`` process
pointed at ``quickzones.adapters.django.worker_app``, and read back through Django's
``get_result``. Django's settings are process-wide, so each Django side runs in a process
of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quickzones.client import Quick
from quickzones.testing.provision.postgres import postgres_skip_reason

django = pytest.importorskip("django")
if django.VERSION < (6, 0):  # Django 6 has django.tasks; before it, the reference package
    pytest.importorskip("django_tasks")

PROJECT = Path(__file__).resolve().parent.parent / "django_project"
PRELUDE = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    try:
        from django.tasks import default_task_backend
        from django.tasks.exceptions import TaskResultDoesNotExist
    except ImportError:
        from django_tasks import default_task_backend
        from django_tasks.exceptions import TaskResultDoesNotExist
    from django.db import connection, transaction
    from shop.tasks import refund, send_receipt
    out = {}
    """
)


def _env(
    app_db: str,
    store: str,
    tmp_path: Path,
    params: dict[str, Any] | None = None,
    other_db: str = "",
    **options: Any,
) -> dict[str, str]:
    """The project's environment: its database(s), quick's store, the backend's OPTIONS
    (``options``) and the entries beside them (``params``: ``ENQUEUE_ON_COMMIT``)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "settings",
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
        "APP_DB": app_db,
        "OTHER_DB": other_db,
        "QUICK_STORE": store,
        "RUN_LOG": str(tmp_path / "runs.log"),
        "TASK_OPTIONS": json.dumps(options),
        "TASK_PARAMS": json.dumps(params or {}),
    }


def _django(env: dict[str, str], script: str, prelude: str = PRELUDE) -> Any:
    """Run ``script`` in a fresh process of the project; returns its ``out`` as JSON."""
    code = prelude + textwrap.dedent(script) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


READ_RESULTS = """
for rid in json.loads(sys.argv[1] if len(sys.argv) > 1 else "[]") or IDS:
    try:
        r = default_task_backend.get_result(rid)
    except TaskResultDoesNotExist:
        out[rid] = None
        continue
    out[rid] = {
        "status": str(r.status), "task": r.task.name, "args": r.args, "kwargs": r.kwargs,
        "return": r.return_value if r.status == "SUCCESSFUL" else None,
        "errors": [e.exception_class_path for e in r.errors],
        "traceback": "".join(e.traceback for e in r.errors),
        "finished": r.finished_at is not None, "attempts": r.attempts,
        "times": [None if t is None else t.timestamp() for t in (
            r.enqueued_at, r.started_at, r.last_attempted_at, r.finished_at)],
    }
"""


def _results(env: dict[str, str], ids: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = _django(env, f"IDS = {ids!r}\n" + READ_RESULTS)
    return found


@pytest.fixture()
def worker_of(tmp_path: Path) -> Iterator[Any]:
    """Start ``quick worker`` on the project's tasks, stopped (SIGTERM) at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "quickzones", "worker", "--managers", "1", "--app-module",
               "quickzones.adapters.django.worker_app", *extra]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=PROJECT, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_finished(env: dict[str, str], ids: list[str], worker: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    while True:
        found = _results(env, ids)
        if all(r is not None and r["finished"] for r in found.values()):
            return found
        if time.monotonic() > deadline or worker.poll() is not None:
            return found
        time.sleep(0.3)


def test_tasks_run_by_quick_worker_results_read_through_django(
    tmp_path: Path, worker_of: Any
) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    env = _env(str(tmp_path / "app.db"), store, tmp_path)
    enqueued = _django(
        env,
        """
        out["ann"] = [send_receipt.enqueue(n, customer="ann").id for n in (1, 2)]
        out["bob"] = [send_receipt.enqueue(3, customer="bob").id]
        out["refund"] = [refund.enqueue(4, customer="bob").id]
        r = default_task_backend.get_result(out["ann"][0])
        out["ready"] = [str(r.status), r.args, r.kwargs, r.task.name]
        out["ready_times"] = [r.enqueued_at is not None, r.started_at, r.last_attempted_at]
        """,
    )
    assert enqueued["ready"] == ["READY", [1], {"customer": "ann"}, "send_receipt"]
    assert enqueued["ready_times"] == [True, None, None]  # enqueued, never started yet
    # Each task sits in its tenant's zone of the app OPTIONS names.
    q = Quick.open(store)
    try:
        for tenant in ("ann", "bob"):
            for rid in enqueued[tenant]:
                status = q.status("shop", tenant, rid.split(":", 1)[0])
                assert status is not None and status.state == "queued"
    finally:
        q.close()

    worker = worker_of(env)
    ids = enqueued["ann"] + enqueued["bob"] + enqueued["refund"]
    found = _wait_finished(env, ids, worker)
    assert worker.poll() is None
    receipts = [found[rid] for rid in enqueued["ann"] + enqueued["bob"]]
    assert [(r["status"], r["return"]) for r in receipts] == [
        ("SUCCESSFUL", {"order": 1, "sent_to": "ann"}),
        ("SUCCESSFUL", {"order": 2, "sent_to": "ann"}),
        ("SUCCESSFUL", {"order": 3, "sent_to": "bob"}),
    ]
    assert receipts[2]["args"] == [3] and receipts[2]["kwargs"] == {"customer": "bob"}
    failed = found[enqueued["refund"][0]]
    assert failed["status"] == "FAILED" and failed["task"] == "refund"
    assert failed["errors"] == ["builtins.ValueError"]
    assert "order 4 was never paid (attempt 1)" in failed["traceback"]
    # Issue 41 point 12: enqueued_at, started_at and last_attempted_at were None once a
    # task ran (Django 5.2 and 6.1). Each is a time now, in order: enqueued, started (this
    # run: it ran once), finished.
    for r in [*receipts, failed]:
        enqueued_at, started_at, last_attempted_at, finished_at = r["times"]
        assert None not in r["times"], r["times"]
        assert enqueued_at <= started_at == last_attempted_at <= finished_at, r["times"]
    assert "quick: this run started" not in failed["traceback"]  # quick's note, not shown
    assert sorted((tmp_path / "runs.log").read_text().splitlines()) == ["ann 1", "ann 2", "bob 3"]
    assert _results(env, ["nosuchitem:ann"]) == {"nosuchitem:ann": None}


def test_enqueue_on_commit_on_a_store_outside_djangos_database(tmp_path: Path) -> None:
    """SQLite store, Django's own SQLite file: not one database, so the item cannot commit
    with Django's transaction; ``enqueue_on_commit`` (default) enqueues it after COMMIT,
    never after ROLLBACK; with Django's ``ENQUEUE_ON_COMMIT: False``, at once."""
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    script = """
    try:
        with transaction.atomic():
            out["rolled_back"] = send_receipt.enqueue(1, customer="ann").id
            raise RuntimeError("declined")
    except RuntimeError:
        pass
    with transaction.atomic():
        out["committed"] = send_receipt.enqueue(2, customer="ann").id
        try:
            default_task_backend.get_result(out["committed"])
            out["seen_before_commit"] = True
        except TaskResultDoesNotExist:
            out["seen_before_commit"] = False
    """
    on = _django(_env(str(tmp_path / "app.db"), store, tmp_path), script)
    off_env = _env(str(tmp_path / "app.db"), store, tmp_path, {"ENQUEUE_ON_COMMIT": False})
    off = _django(off_env, script)
    q = Quick.open(store)
    try:

        def queued(rid: str) -> bool:
            return q.status("shop", "ann", rid.split(":", 1)[0]) is not None

        assert on["seen_before_commit"] is False
        assert (queued(on["rolled_back"]), queued(on["committed"])) == (False, True)
        assert off["seen_before_commit"] is True
        assert (queued(off["rolled_back"]), queued(off["committed"])) == (True, True)
    finally:
        q.close()


def test_tenant_from_a_callable_and_bad_options_refused(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    env = _env(str(tmp_path / "app.db"), store, tmp_path)
    found = _django(
        env,
        """
        try:
            send_receipt.enqueue(1)
        except Exception as err:
            out["missing"] = [type(err).__name__, str(err)]
        """,
    )
    assert found["missing"][0] in ("InvalidTaskError", "InvalidTask")
    assert "customer" in found["missing"][1] and "send_receipt" in found["missing"][1]

    by_callable = _env(str(tmp_path / "app.db"), store, tmp_path, tenant="shop.tenants.from_order")
    (PROJECT / "shop" / "tenants.py").exists() or pytest.fail("shop/tenants.py is missing")
    found = _django(by_callable, 'out["id"] = send_receipt.enqueue(7, customer="x").id')
    q = Quick.open(store)
    try:
        assert q.status("shop", "odd", found["id"].split(":", 1)[0]) is not None
    finally:
        q.close()

    for bad, says in [
        ({"colour": "blue"}, "colour"),
        ({"keep_result_s": -1}, "keep_result_s"),
        ({"tenant": "shop.tenants.nowhere"}, "cannot import"),
        # Options that went (issue 27 point 5): each refused with what replaced it.
        ({"tenant_kwarg": "customer"}, "'tenant' a callable"),
        ({"default_tenant": "t"}, "'tenant' a callable"),
        ({"database": "default"}, "NAME, HOST and PORT"),
        ({"enqueue_on_commit": False}, "ENQUEUE_ON_COMMIT"),
        ({"task_modules": ["shop.async_tasks"]}, "installed app's tasks module"),
    ]:
        found = _django(
            _env(str(tmp_path / "app.db"), store, tmp_path, **bad),
            """
            try:  # the backend is built when the first @task is declared
                from shop.tasks import send_receipt
                send_receipt.enqueue(1, customer="ann")
            except Exception as err:
                out["err"] = [type(err).__name__, str(err)]
            """,
            prelude="import json, sys\nimport django\ndjango.setup()\nout = {}\n",
        )
        assert found["err"][0] == "ImproperlyConfigured" and says in found["err"][1], found


@pytest.mark.skipif(postgres_skip_reason() is not None, reason=str(postgres_skip_reason()))
def test_postgres_rows_and_task_commit_together(tmp_path: Path, worker_of: Any) -> None:
    """Django and quick in one PostgreSQL database: inside ``transaction.atomic()`` the
    order row and its task commit together (neither visible before COMMIT), and roll back
    together; the worker runs only the committed one."""
    psycopg = pytest.importorskip("psycopg")
    from tests.postgres import postgres_store_url

    store = postgres_store_url()
    server = store.split("?")[0]
    schema = store.split("schema=")[1]
    table = f'"{schema}".orders'
    Quick.open(store).close()  # quick's schema first: it refuses one holding other tables
    with psycopg.connect(server, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    env = _env(server, store, tmp_path)
    # The reader keeps its steady clock, whose floor exchange is a commit on a key every
    # process shares. When the enqueue's own clock reading exchanged inside atomic(), the
    # exchange joined Django's transaction and held that key's lock to its COMMIT, so this
    # read inside atomic() waited for it (61-64 s, lock_timeout and retries); the clock now
    # leaves the exchange for a reading outside the application's transaction.
    found = _django(
        env,
        f"""
        import psycopg
        from quickzones.client import Quick
        q = Quick.open({store!r})
        TABLE = {table!r}

        def outside():
            with psycopg.connect({server!r}, autocommit=True) as other:
                rows = other.execute(f"SELECT id FROM {{TABLE}} ORDER BY id").fetchall()
            return [r[0] for r in rows]

        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(f"INSERT INTO {{TABLE}} VALUES (1)")
            out["kept"] = send_receipt.enqueue(1, customer="ann").id
            out["before_commit"] = [outside(), q.status("shop", "ann", out["kept"].split(":")[0])]
        out["after_commit"] = [outside(), q.status("shop", "ann", out["kept"].split(":")[0]).state]
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute(f"INSERT INTO {{TABLE}} VALUES (2)")
                out["dropped"] = send_receipt.enqueue(2, customer="ann").id
                raise RuntimeError("declined")
        except RuntimeError:
            pass
        out["after_rollback"] = [outside(), q.status("shop", "ann", out["dropped"].split(":")[0])]
        """,
    )
    assert found["before_commit"] == [[], None]
    assert found["after_commit"] == [[1], "queued"]
    assert found["after_rollback"] == [[1], None]

    worker = worker_of(env)
    results = _wait_finished(env, [found["kept"]], worker)
    assert results[found["kept"]]["status"] == "SUCCESSFUL"
    assert results[found["kept"]]["return"] == {"order": 1, "sent_to": "ann"}
    assert _results(env, [found["dropped"]]) == {found["dropped"]: None}
    assert (tmp_path / "runs.log").read_text().splitlines() == ["ann 1"]


def test_threads_share_one_quick(tmp_path: Path) -> None:
    """Django builds a backend per thread; they share one Quick (one pool, one open)."""
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    found = _django(
        env,
        """
        import threading
        try:
            from django.tasks import task_backends
        except ImportError:
            from django_tasks import task_backends
        seen = []

        def enqueue():
            send_receipt.enqueue(1, customer="ann")
            seen.append((id(task_backends["default"]), id(task_backends["default"].quick)))

        threads = [threading.Thread(target=enqueue) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["backends"] = len({b for b, _ in seen})
        out["quicks"] = len({q for _, q in seen})
        """,
    )
    assert (found["backends"], found["quicks"]) == (4, 1)


def test_one_tenants_burst_does_not_starve_another(tmp_path: Path, worker_of: Any) -> None:
    """The point of quick under Django: 300 tasks of tenant "big" are queued before one of
    tenant "small"; one worker thread runs it among the first, not after the 300 (a single
    FIFO queue, as Django's database backends keep, runs it last: position 301)."""
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    found = _django(
        env,
        """
        for n in range(300):
            send_receipt.enqueue(n, customer="big")
        out["small"] = send_receipt.enqueue(0, customer="small").id
        """,
    )
    worker = worker_of(env, "--workers", "1")
    results = _wait_finished(env, [found["small"]], worker)
    assert results[found["small"]]["status"] == "SUCCESSFUL"
    ran = (tmp_path / "runs.log").read_text().splitlines()
    position = ran.index("small 0") + 1
    print(f"small tenant's task ran {position} of {len(ran)} so far")
    assert position <= 50, position


def test_async_task_priority_and_run_after(tmp_path: Path, worker_of: Any) -> None:
    """An ``async def`` task runs; Django's priority (higher first) becomes quick's (lower
    first) and ``run_after`` the item's delay."""
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    env = _env(str(tmp_path / "app.db"), store, tmp_path)  # shop.tasks imports the async one
    found = _django(
        env,
        """
        from datetime import timedelta
        from django.utils import timezone
        from shop.async_tasks import total
        out["async"] = total.enqueue(2, 3, customer="ann").id
        out["urgent"] = send_receipt.enqueue(1, customer="ann").id
        later = send_receipt.using(run_after=timezone.now() + timedelta(hours=1))
        out["later"] = later.enqueue(2, customer="ann").id
        """,
    )
    q = Quick.open(store)
    try:
        urgent = q.get("shop", "ann", found["urgent"].split(":", 1)[0])
        later = q.get("shop", "ann", found["later"].split(":", 1)[0])
        assert urgent is not None and urgent.priority == -10  # @task(priority=10)
        assert later is not None and later.vesting_ms - later.enqueued_ms >= 3_500_000
    finally:
        q.close()
    worker = worker_of(env)
    results = _wait_finished(env, [found["async"], found["urgent"]], worker)
    assert (results[found["async"]]["status"], results[found["async"]]["return"]) == (
        "SUCCESSFUL",
        5,
    )
    assert _results(env, [found["later"]])[found["later"]]["status"] == "READY"


@pytest.mark.skipif(postgres_skip_reason() is not None, reason=str(postgres_skip_reason()))
def test_django_on_postgres_store_on_sqlite_enqueues_on_commit(tmp_path: Path) -> None:
    """Django's database is PostgreSQL, quick's store a SQLite file: the item cannot join
    Django's transaction, so it is enqueued after COMMIT and never after ROLLBACK."""
    from tests.postgres import postgres_store_url

    server = postgres_store_url().split("?")[0]
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    found = _django(
        _env(server, store, tmp_path),
        """
        try:
            with transaction.atomic():
                out["rolled_back"] = send_receipt.enqueue(1, customer="ann").id
                raise RuntimeError("declined")
        except RuntimeError:
            pass
        with transaction.atomic():
            out["committed"] = send_receipt.enqueue(2, customer="ann").id
        """,
    )
    q = Quick.open(store)
    try:
        assert q.status("shop", "ann", found["rolled_back"].split(":", 1)[0]) is None
        assert q.status("shop", "ann", found["committed"].split(":", 1)[0]) is not None
    finally:
        q.close()


@pytest.mark.parametrize("alias", ["default", "other"])
def test_django_and_quick_in_one_sqlite_file_commit_together(tmp_path: Path, alias: str) -> None:
    """One of Django's SQLite databases is quick's store file (its only one, or its second,
    alias ``other``): the backend finds that alias by the store's file, and a task
    enqueued in its ``transaction.atomic(using=alias)`` is written into the transaction
    (its row and the item commit or roll back together). Before the alias was derived,
    the second database's enqueue committed on its own and waited 10 s for Django's lock
    on the file (StoreBusy)."""
    db = tmp_path / "one.db"
    # quick's tables first (a worker or any open creates them): creating them inside
    # Django's write transaction on the same file would wait for that transaction's lock.
    Quick.open(f"sqlite:///{db}").close()
    if alias == "default":
        env = _env(str(db), f"sqlite:///{db}", tmp_path)
    else:
        env = _env(str(tmp_path / "app.db"), f"sqlite:///{db}", tmp_path, other_db=str(db))
    found = _django(
        env,
        f"""
        from django.db import connections
        ALIAS = {alias!r}
        with connections[ALIAS].cursor() as cur:
            cur.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
        try:
            with transaction.atomic(using=ALIAS):
                with connections[ALIAS].cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES (1)")
                out["rolled_back"] = send_receipt.enqueue(1, customer="ann").id
                raise RuntimeError("declined")
        except RuntimeError:
            pass
        with transaction.atomic(using=ALIAS):
            out["committed"] = send_receipt.enqueue(2, customer="ann").id
            with connections[ALIAS].cursor() as cur:
                cur.execute("INSERT INTO orders VALUES (2)")
        out["joined"] = default_task_backend._joins
        with connections[ALIAS].cursor() as cur:
            out["rows"] = [r[0] for r in cur.execute("SELECT id FROM orders").fetchall()]
        """,
    )
    assert found["joined"] is True and found["rows"] == [2]
    q = Quick.open(f"sqlite:///{db}")
    try:
        assert q.status("shop", "ann", found["rolled_back"].split(":", 1)[0]) is None
        assert q.status("shop", "ann", found["committed"].split(":", 1)[0]) is not None
    finally:
        q.close()


def test_the_default_tenant_is_the_tenant_keyword_else_default(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'quick.db'}"
    found = _django(
        _env(str(tmp_path / "app.db"), store, tmp_path, tenant=None),  # no 'tenant' option
        """
        from shop.tasks import note
        out["acme"] = note.enqueue("hi", tenant="acme").id
        out["default"] = note.enqueue("hi").id
        """,
    )
    q = Quick.open(store)
    try:
        for tenant in ("acme", "default"):
            assert q.status("shop", tenant, found[tenant].split(":", 1)[0]) is not None, tenant
    finally:
        q.close()


def test_worker_app_without_django_settings_says_so(tmp_path: Path) -> None:
    env = _env(str(tmp_path / "app.db"), f"sqlite:///{tmp_path / 'quick.db'}", tmp_path)
    del env["DJANGO_SETTINGS_MODULE"]
    cmd = [sys.executable, "-m", "quickzones", "worker", "--app-module",
           "quickzones.adapters.django.worker_app"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "DJANGO_SETTINGS_MODULE" in proc.stderr and "Traceback" not in proc.stderr

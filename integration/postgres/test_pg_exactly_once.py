"""No acknowledged enqueue lost, none run twice, through PostgreSQL's own faults (issue 42
point 5). Producer processes (``Quick.enqueue``, and ``Quick.enqueue_on`` inside the
application's own transaction that also INSERTs a row) and ``quick worker`` processes
running a transactional handler keep going while the server is

- stopped as ``pg_ctl stop -m immediate`` does (SIGQUIT: no checkpoint, WAL replay) and
  started again;
- paused: its postmaster SIGSTOPped for a few seconds (new connections wait, open ones
  work), or every server process (a hung server), then SIGCONT;
- made to drop every client connection (``pg_terminate_backend``), three times;
- behind a proxy that loses answers (``reply_cutter.py``): a connection cut after the
  server acted and before its answer arrived, for 3 s 2 % of the server's answers, then
  for 3 s a fifth of those saying a COMMIT is done, so the client cannot know it
  committed (``commit_unknown_result``). With the worker's check of a maybe-committed
  transactional attempt removed (``Worker._run_transactional``'s ``before_retry``) and a
  completion that finds its item gone taken as done, this scenario counted 8 doubled
  effects in one run: the books below do see a double.

At the end every acknowledged enqueue's effect committed exactly once (the handler's
write commits with the item's completion: ``integration/postgres/load.py``); an enqueue
that raised ran once or never; no effect appears that no producer asked for; and the
application's rows are exactly those whose items ran (row and item commit together).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from integration.postgres.load import Load, Tally, drained
from integration.postgres.reply_cutter import COMMITTED, ReplyCutter
from integration.postgres.test_postgres_faults import _drop_connections, server
from quickzones.client import Quick
from quickzones.testing.provision.postgres import LocalPostgres
from tests.waiting import wait_for

__all__ = ["server"]  # the private server fixture, which these tests stop and restart

psycopg = pytest.importorskip("psycopg")

TABLE = "orders"
# Enqueues acknowledged before the fault, and after it (the producers got going again).
PROGRESS = 30
# The faults' lengths: long enough that calls in flight fail or wait, short for a test.
DOWN_S = 1.5
PAUSED_S = 3.0
TERMINATIONS = 3
# Answers lost: each chunk the server sends is dropped, with its connection, with this
# chance, for this long; then, as long, this share of the answers saying a COMMIT is done.
CUT_P = 0.02
COMMIT_CUT_P = 0.2
CUTTING_S = 3.0
# Two producers calling Quick.enqueue, two calling Quick.enqueue_on in their own transaction.
PRODUCERS = {"p0": "plain", "p1": "app", "p2": "plain", "p3": "app"}


def _runs(load: Load) -> int:
    return len(load.runs.read_text().split())


def _progress(load: Load, items: int) -> None:
    """Wait until ``items`` more enqueues were acknowledged and handlers ran since now."""
    acked, ran = load.acked(), _runs(load)
    assert wait_for(lambda: load.acked() >= acked + items and _runs(load) > ran, 60), (
        f"no progress: {load.acked() - acked} acks, {_runs(load) - ran} runs in 60 s\n"
        + load.worker_output()
    )


def restart(server: LocalPostgres, load: Load) -> None:
    server.stop_immediate()  # pg_ctl stop -m immediate
    time.sleep(DOWN_S)  # the outage's length, not a wait for a result
    server.start()


def pause_postmaster(server: LocalPostgres, load: Load) -> None:
    server.pause()
    time.sleep(PAUSED_S)  # the pause's length
    server.resume()


def pause_server(server: LocalPostgres, load: Load) -> None:
    server.pause(backends=True)
    time.sleep(PAUSED_S)
    server.resume()


def terminate_backends(server: LocalPostgres, load: Load) -> None:
    for n in range(TERMINATIONS):
        if n:
            _progress(load, 5)  # each round hits a load that is running again
        _drop_connections(server)


FAULTS: dict[str, Callable[[LocalPostgres, Load], None]] = {
    "restart": restart,
    "pause_postmaster": pause_postmaster,
    "pause_server": pause_server,
    "terminate_backends": terminate_backends,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_acknowledged_enqueue_runs_exactly_once(
    tmp_path: Path, server: LocalPostgres, fault: str
) -> None:
    _exactly_once(tmp_path, server, fault, lambda load: FAULTS[fault](server, load))


def test_every_acknowledged_enqueue_runs_exactly_once_when_answers_are_lost(
    tmp_path: Path, server: LocalPostgres
) -> None:
    """Connections cut after the server acted and before its answer arrived, a COMMIT's
    included: the clients retry what may have committed (commit_unknown_result)."""
    cutter = ReplyCutter(server.port)
    try:

        def cut(load: Load) -> None:
            with cutter.cutting(CUT_P):
                time.sleep(CUTTING_S)  # the fault's length
            with cutter.cutting(COMMIT_CUT_P, holding=COMMITTED):
                time.sleep(CUTTING_S)

        _exactly_once(tmp_path, server, "answers_lost", cut, via=cutter.port)
    finally:
        cutter.close()
    print(f"answers_lost: {cutter.cut} connections cut")
    assert cutter.cut >= 10, f"only {cutter.cut} connections cut: the fault hardly happened"


def _exactly_once(
    tmp_path: Path,
    server: LocalPostgres,
    name: str,
    fault: Callable[[Load], None],
    via: int | None = None,
) -> None:
    """Run the load, inject ``fault`` once it is going, check the books. The load's
    processes reach the server through port ``via`` (a proxy) when given; the test's own
    reads go straight to it."""
    db = server.url
    url = f"{db}?schema=fx"
    through = db.replace(f":{server.port}/", f":{via}/") if via else db
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {TABLE} (tag text PRIMARY KEY)")
    q = Quick.open(url)  # the schema exists before the processes start
    started = time.monotonic()
    load = Load(tmp_path, f"{through}?schema=fx", through, TABLE, PRODUCERS, workers=2)
    try:
        assert wait_for(load.ready, 60), f"the load never got going:\n{load.worker_output()}"
        _progress(load, PROGRESS)
        fault(load)
        _progress(load, PROGRESS)
        load.stop_producers()
        finished = load.finished()
        settled = wait_for(lambda: drained(q) and not Tally.read(load, q, db).lost(), timeout=60)
        alive = load.workers_alive()
    finally:
        load.close()
    tally = Tally.read(load, q, db)
    dead = q.dead_letters()
    q.close()
    took = time.monotonic() - started
    print(f"{name}: {tally.figures(took)}")
    assert alive, f"a worker exited:\n{load.worker_output()}"
    assert finished, "a producer did not run to its end (see its producer-*.out)"
    assert not dead, f"dead-lettered: {[(d.item_id, d.reason) for d in dead]}"
    assert not tally.lost(), f"{len(tally.lost())} acknowledged enqueues never ran"
    assert settled, "the zones never emptied"
    assert not tally.doubled(), f"effects committed more than once: {tally.doubled()}"
    assert not tally.unexplained(), f"effects nobody enqueued: {tally.unexplained()}"
    rows_alone, items_alone = tally.split()
    assert not rows_alone, f"app rows committed without their item: {rows_alone}"
    assert not items_alone, f"items committed without their app row: {items_alone}"
    # And by item id: the id each acknowledged call returned is the one that ran.
    assert set(tally.acked.values()) <= set(tally.by_id)

"""Bulk requeue and purge of dead letters by app, tenant and job type, with a limit, from
the ``quick`` CLI and from ``Quick``/``AsyncQuick`` (issue 28 point 16): requeue in bounded
transactions, purge without a filter only after a confirmation."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.aio import AsyncQuick
from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import PermanentError
from quickzones.registry import JobContext
from quickzones.store.kv import KVTransaction
from tests.conftest import store_url
from tests.waiting import wait_for

QUICK = Path(sys.executable).with_name("quick")

# (app, tenant, job type): every letter's id is "<tenant>-<job type>".
LETTERS = [
    ("a", "t1", "x"),
    ("a", "t1", "y"),
    ("a", "t2", "x"),
    ("b", "t1", "x"),
    ("b", "t3", "y"),
]


def _bury(q: Quick) -> None:
    for job_type in ("x", "y"):

        @q.job(job_type)
        def doomed(payload: object, ctx: JobContext) -> None:
            raise PermanentError("no way")

    for app, tenant, job_type in LETTERS:
        q.enqueue(job_type, {"n": 1}, app=app, tenant=tenant, item_id=f"{tenant}-{job_type}")
    q.consumer().run_until_idle()  # no handler runs again after this: nothing is drained
    assert len(q.dead_letters()) == len(LETTERS)


def _dead(q: Quick) -> set[tuple[str, str, str]]:
    return {(d.zone.app, d.zone.tenant, d.item_id) for d in q.dead_letters()}


def _queued(q: Quick) -> set[tuple[str, str, str]]:
    return {
        (app, tenant, f"{tenant}-{job}")
        for app, tenant, job in LETTERS
        if q.get(app, tenant, f"{tenant}-{job}") is not None
    }


def _all() -> set[tuple[str, str, str]]:
    return {(a, t, f"{t}-{j}") for a, t, j in LETTERS}


def _want(app: str | None, tenant: str | None, job_type: str | None) -> set[tuple[str, str, str]]:
    return {
        (a, t, f"{t}-{j}")
        for a, t, j in LETTERS
        if app in (None, a) and tenant in (None, t) and job_type in (None, j)
    }


FILTERS = [
    (None, None, None),
    ("a", None, None),
    (None, "t1", None),
    (None, None, "x"),
    ("a", None, "x"),
    (None, "t1", "y"),
    ("b", "t3", "y"),
    ("a", "t9", None),
]


@pytest.mark.parametrize(("app", "tenant", "job_type"), FILTERS)
def test_requeue_and_purge_by_any_combination(
    q: Quick, app: str | None, tenant: str | None, job_type: str | None
) -> None:
    _bury(q)
    want = _want(app, tenant, job_type)
    listed = q.dead_letters(app, tenant, job_type=job_type)
    assert {(d.zone.app, d.zone.tenant, d.item_id) for d in listed} == want
    assert q.requeue_dead_letters(app, tenant, job_type=job_type).requeued == len(want)
    assert _queued(q) == want and _dead(q) == _all() - want
    # Bury them again, then purge with the same filters.
    q.consumer().run_until_idle()
    assert _dead(q) == _all()
    assert q.purge_dead_letters(app, tenant, job_type=job_type) == len(want)
    assert _dead(q) == _all() - want


def test_limit_bounds_requeue_and_purge(q: Quick) -> None:
    _bury(q)
    done = q.requeue_dead_letters("a", limit=2)
    assert done.requeued == 2 and done.kept == []
    assert len(_queued(q)) == 2 and len(_dead(q) & _want("a", None, None)) == 1
    # a/t1-x and a/t1-y went back; a/t2-x and b/t1-x are x's letters left
    assert q.purge_dead_letters(job_type="x", limit=1) == 1
    assert len(q.dead_letters(job_type="x")) == 1


def test_requeue_keeps_a_letter_whose_id_is_queued_and_moves_the_others(q: Quick) -> None:
    _bury(q)
    q.enqueue("other", {"n": 2}, app="a", tenant="t1", item_id="t1-x")
    done = q.requeue_dead_letters("a", "t1")
    assert done.requeued == 1 and [(k.zone.tenant, k.item_id) for k in done.kept] == [
        ("t1", "t1-x")
    ]
    assert ("a", "t1", "t1-x") in _dead(q) and ("a", "t1", "t1-y") not in _dead(q)


def test_requeue_of_many_letters_moves_each_exactly_once(q: Quick) -> None:
    """More letters than one transaction moves: each moves exactly once."""

    @q.job("z")
    def doomed(payload: object, ctx: JobContext) -> None:
        raise PermanentError("no way")

    q.enqueue_many("z", list(range(250)), app="a", tenant="t")
    q.consumer().run_until_idle()
    assert len(q.dead_letters()) == 250
    assert q.requeue_dead_letters("a", "t").requeued == 250
    assert q.dead_letters() == [] and q.zones.count(q.zone("a", "t")) == 250


def test_async_bulk(backend: str, tmp_path: Path) -> None:
    aq = AsyncQuick.open(store_url(backend, tmp_path), clock=ManualClock())
    try:
        _bury(aq.quick)

        async def go() -> tuple[int, int, int]:
            listed = len(await aq.dead_letters(job_type="x"))
            requeued = (await aq.requeue_dead_letters(tenant="t1", job_type="x")).requeued
            purged = await aq.purge_dead_letters(app="b", job_type="y", limit=5)
            return listed, requeued, purged

        assert asyncio.run(go()) == (3, 2, 1)
    finally:
        aq.quick.close()


# --- the CLI -------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    q = Quick.open(url)
    try:
        _bury(q)
    finally:
        q.close()
    return url


def invoke(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def _cli_dead(store: str) -> set[tuple[str, str, str]]:
    code, out, err = invoke("--store", store, "dead-letters", "list", "--json")
    assert code == 0, err
    return {(d["app"], d["tenant"], d["item_id"]) for d in json.loads(out)}


def test_cli_requeue_by_app_alone(store: str) -> None:
    code, out, err = invoke("--store", store, "dead-letters", "requeue", "--app", "a")
    assert code == 0, err
    assert out.strip() == "requeued 3"
    assert _cli_dead(store) == _all() - _want("a", None, None)


def test_cli_requeue_by_job_type_with_limit(store: str) -> None:
    code, out, err = invoke(
        "--store", store, "dead-letters", "requeue", "--job-type", "x", "--limit", "2"
    )
    assert code == 0, err
    assert out.strip() == "requeued 2"
    assert len(_cli_dead(store) & _want(None, None, "x")) == 1


def test_cli_purge_by_tenant_and_job_type(store: str) -> None:
    code, out, err = invoke(
        "--store", store, "dead-letters", "purge", "--tenant", "t1", "--job-type", "x"
    )
    assert code == 0, err
    assert out.strip() == "purged 2"
    assert _cli_dead(store) == _all() - _want(None, "t1", "x")


def test_cli_purge_without_a_filter_asks_first(store: str) -> None:
    code, _, _ = invoke("--store", store, "dead-letters", "purge", stdin="n\n")
    assert code != 0
    assert _cli_dead(store) == _all()  # answered no: nothing deleted
    code, out, err = invoke("--store", store, "dead-letters", "purge", stdin="y\n")
    assert code == 0, err
    assert "purged 5" in out and _cli_dead(store) == set()


def test_cli_purge_without_a_filter_and_yes_does_not_ask(store: str) -> None:
    code, out, err = invoke("--store", store, "dead-letters", "purge", "--yes")
    assert code == 0, err
    assert out.strip() == "purged 5" and _cli_dead(store) == set()


def test_a_requeue_killed_midway_loses_nothing(tmp_path: Path) -> None:
    """``quick dead-letters requeue`` SIGKILLed while it moves 4,000 letters: every letter
    is afterwards either still dead or queued in its zone, exactly once; what moved, moved
    in whole transactions (100 letters each)."""
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    total = 4000
    q = Quick.open(url)
    try:
        zone = q.zone("a", "t")
        for start in range(0, total, 1000):
            ids = [f"i{n}" for n in range(start, start + 1000)]
            for item_id in ids:
                q.enqueue("z", {"n": item_id}, app="a", tenant="t", item_id=item_id)

            def bury(tr: KVTransaction, ids: list[str] = ids) -> None:
                for item_id in ids:
                    q.zones.dead_letter(zone, item_id, None, "buried", tr=tr)

            q.transact(bury)
        assert len(q.dead_letters()) == total
        proc = subprocess.Popen(
            [str(QUICK), "--store", url, "dead-letters", "requeue", "--app", "a"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert wait_for(lambda: q.zones.count(zone) > 0 or proc.poll() is not None)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        dead = {d.item_id for d in q.dead_letters()}
        queued = {f"i{n}" for n in range(total) if q.get("a", "t", f"i{n}") is not None}
        assert dead.isdisjoint(queued) and len(dead) + len(queued) == total
        assert q.zones.count(zone) == len(queued) and len(queued) % 100 == 0
    finally:
        q.close()


def test_requeue_of_letters_larger_together_than_one_transaction(q: Quick) -> None:
    """12 letters of 1 MiB each (more than a 10 MB transaction holds): moved in several
    transactions, every one back in its zone whole."""
    payload = bytes(range(256)) * (1024 * 1024 // 256)

    @q.job("big")
    def big(body: bytes, ctx: JobContext) -> None:
        raise PermanentError("no way")

    ids = [q.enqueue("big", payload, app="a", tenant="t") for _ in range(12)]
    q.consumer().run_until_idle()
    assert len(q.dead_letters()) == 12
    assert q.requeue_dead_letters("a").requeued == 12
    assert q.dead_letters() == []
    for item_id in ids:
        item = q.get("a", "t", item_id)
        assert item is not None and item.payload == payload

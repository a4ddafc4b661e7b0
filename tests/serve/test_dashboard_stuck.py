"""The dashboard shows what is stuck (issue 45 point 4): what runs now, since when and on
which consumer, flagged when it runs longer than its job type's usual p99; failed runs
per job type per minute; dead letters grouped by job type and error, a group requeued
from one confirmed click, a bounded number per request. Over HTTP with a real server, a
real consumer where who runs what matters, and in headless Chromium for the screenshots
kept in ``docs/img/`` (test_dashboard_stuck_browser.py)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteLease, RemoteQuick
from quickzones.client import Quick
from quickzones.consumer.config import ConsumerConfig
from quickzones.store import admin as admin_reads
from quickzones.store import heartbeats
from tests.waiting import wait_for

from .conftest import ServerThread


@pytest.fixture(params=["memory", "sqlite"])
def q(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quick]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'q.db'}"
    quick = Quick.open(url)
    try:
        yield quick
    finally:
        quick.close()


def _signed_in(url: str, token: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=url)
    assert client.post("/login", data={"token": token}).status_code == 303
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/").text)
    assert csrf is not None
    return client, csrf[1]


def _rows(html: str, attr: str) -> list[str]:
    return re.findall(rf'<tr {attr}="([^"]+)"', html)


def test_running_items_show_since_when_and_on_which_consumer_and_the_slow_are_flagged(
    q: Quick,
) -> None:
    release = threading.Event()
    ran = {"quick": 0}

    @q.job("report")
    def report(payload: Any, ctx: Any) -> None:
        if payload["block"]:
            release.wait(timeout=120)
        else:
            ran["quick"] += 1

    tokens = TokenStore(q.kv, q.keys, q.clock)
    viewer = tokens.create("shop", ["view"])[0]
    consumer = q.consumer(ConsumerConfig(workers=4), name="consumer-1", heartbeat_s=0.2)
    consumer.start()
    try:
        # Its usual run time: twenty runs that return at once.
        q.enqueue_many("report", [{"block": False}] * 20, app="shop", tenant="acme")
        assert wait_for(lambda: ran["quick"] == 20)
        blocked = [
            q.enqueue("report", {"block": True}, app="shop", tenant=f"t{n}") for n in range(2)
        ]
        with ServerThread(create_app(q)) as server:
            client, _ = _signed_in(server.url, viewer)

            def running() -> str:
                return client.get("/apps/shop/running").text

            assert wait_for(lambda: sorted(_rows(running(), "data-item")) == sorted(blocked))
            page = running()
            assert page.count('data-col="consumer">consumer-1<') == 2
            # Each has run longer than every one of the twenty before it: flagged.
            slow = re.compile(r'<tr data-item="[^"]+" class="slow">')
            assert wait_for(lambda: len(slow.findall(running())) == 2)
            release.set()
            assert wait_for(lambda: _rows(running(), "data-item") == [])
    finally:
        release.set()
        consumer.stop()


def _serve(q: Quick) -> tuple[FastAPI, Callable[[], None]]:
    """A server and its heartbeat, driven here (it beats every few seconds on its own)."""
    app = create_app(q)
    return app, app.state.quick.leaser.pull_runs.heartbeats.beat_once


def _lease(rq: RemoteQuick, n: int) -> list[RemoteLease]:
    leased: list[RemoteLease] = []
    while len(leased) < n:
        leased += rq.lease(n - len(leased), app="shop", wait_s=2, lease_s=600)
    return leased


def test_the_running_list_is_paged_and_forgets_runs_that_ended(q: Quick) -> None:
    """Items ``quick serve`` leased to a remote worker: its own heartbeat record lists
    them, so they show as a consumer's do, the server as their consumer."""
    for n in range(60):
        q.enqueue("sync", {"n": n}, app="shop", tenant=f"tenant-{n:02}")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    viewer = tokens.create("shop", ["view"])[0]
    worker = tokens.create("shop", ["consume"])[0]
    app, beat = _serve(q)
    with ServerThread(app) as server, RemoteQuick(server.url, worker) as rq:
        leased = _lease(rq, 60)
        beat()
        client, _ = _signed_in(server.url, viewer)
        first = client.get("/apps/shop/running").text
        assert len(_rows(first, "data-item")) == 50
        assert first.count(f'data-col="consumer">{app.state.quick.leaser.name}<') == 50
        cursor = re.search(r'href="\?cursor=([^"]+)" rel="next"', first)
        assert cursor is not None
        second = client.get(f"/apps/shop/running?cursor={cursor[1]}").text
        assert len(_rows(second, "data-item")) == 10
        assert not set(_rows(first, "data-item")) & set(_rows(second, "data-item"))
        # Completed, failed and cancelled runs leave the list at the server's next beat.
        done, failed, cancelled = leased[:3]
        rq.complete(done)
        rq.nack(failed, 60, error="x")
        q.cancel("shop", cancelled.tenant, cancelled.item_id)
        assert rq.cancelled([cancelled]) == [True]  # as its remote worker asks
        beat()
        shown = []
        page = client.get("/apps/shop/running").text
        shown += _rows(page, "data-item")
        cursor = re.search(r'href="\?cursor=([^"]+)" rel="next"', page)
        assert cursor is not None
        shown += _rows(client.get(f"/apps/shop/running?cursor={cursor[1]}").text, "data-item")
        assert sorted(shown) == sorted(x.item_id for x in leased[3:])
        bad = client.get("/apps/shop/running?cursor=nonsense")
        assert bad.status_code == 400 and "cursor" in bad.text
        # Nothing held: the server keeps no record (it is no consumer without leases).
        rq.complete_many(leased[3:])
        beat()
        assert _rows(client.get("/apps/shop/running").text, "data-item") == []
        assert heartbeats.heartbeats(q.kv, q.keys) == []


def test_failed_runs_are_charted_per_job_type_and_minute(q: Quick) -> None:
    """Failed runs a remote worker reports through ``quick serve``, counted by the server
    as a consumer counts its own and added with its heartbeat."""
    for n in range(5):
        q.enqueue("email" if n < 3 else "sms", {"n": n}, app="shop", tenant="acme")
    q.enqueue("email", {}, app="shop", tenant="other")
    tokens = TokenStore(q.kv, q.keys, q.clock)
    viewer = tokens.create("shop", ["view"])[0]
    worker = tokens.create("shop", ["consume"])[0]
    app, beat = _serve(q)
    with ServerThread(app) as server, RemoteQuick(server.url, worker) as rq:
        for lease in _lease(rq, 6):
            if lease.tenant == "other":  # a success counts nothing
                rq.complete(lease)
            elif lease.job_type == "email":  # a retry: the run raised
                rq.nack(lease, 60, error="boom")
            else:  # out of attempts: dead-lettered by its holder
                rq.fail(lease, "ValueError: bad number 7")
        beat()
        client, _ = _signed_in(server.url, viewer)
        page = client.get("/apps/shop/errors").text
        assert "<svg" in page and "Failed runs per minute" in page
        totals = dict(re.findall(r'<tr data-type="([^"]+)">.*?data-col="hour">(\d+)<', page, re.S))
        assert totals == {"email": "3", "sms": "2"}
        bars = re.findall(r'data-type="(\w+)" data-errors="(\d+)"', page)
        assert sorted(bars) == [("email", "3"), ("sms", "2")]


def _dead(q: Quick, job_type: str, reasons: list[str], tenant: str = "acme") -> None:
    zone = q.zone("shop", tenant)
    for reason in reasons:
        item_id = q.enqueue(job_type, {}, app="shop", tenant=tenant)
        q.zones.dead_letter(zone, item_id, None, reason)


def test_dead_letters_are_grouped_and_a_group_is_requeued_a_bounded_part_at_a_time(
    q: Quick,
) -> None:
    # 230 letters of one group (their numbers differ), one of another error, one of
    # another type with the same error.
    _dead(q, "email", [f"LookupError: order {n} not found" for n in range(230)])
    _dead(q, "email", ["TimeoutError: smtp"])
    _dead(q, "sms", ["LookupError: order 5 not found"])
    tokens = TokenStore(q.kv, q.keys, q.clock)
    admin = tokens.create("shop", ["admin"])[0]
    viewer = tokens.create("shop", ["view"])[0]
    with ServerThread(create_app(q)) as server:
        client, csrf = _signed_in(server.url, admin)
        page = client.get("/apps/shop/dead-letters/groups").text
        groups = re.findall(r'<tr data-group="([^"]*)">.*?data-col="count">(\d+)<', page, re.S)
        assert groups == [
            ("email: LookupError: order # not found", "230"),
            ("email: TimeoutError: smtp", "1"),
            ("sms: LookupError: order # not found", "1"),
        ]
        form = {"job_type": "email", "error": "LookupError: order # not found"}
        confirm = client.get("/apps/shop/dead-letters/groups/confirm", params=form)
        assert confirm.status_code == 200 and "230" in confirm.text
        # Refused without the confirmation, without the CSRF token, or for a view token:
        # nothing moves.
        assert client.post("/apps/shop/dead-letters/groups/requeue",
                           data={**form, "csrf": csrf}).status_code == 400  # fmt: skip
        assert client.post("/apps/shop/dead-letters/groups/requeue",
                           data={**form, "confirm": "yes"}).status_code == 403  # fmt: skip
        view_client, view_csrf = _signed_in(server.url, viewer)
        assert view_client.post("/apps/shop/dead-letters/groups/requeue",
                                data={**form, "confirm": "yes", "csrf": view_csrf}
                                ).status_code == 403  # fmt: skip
        assert len(q.dead_letters(app="shop")) == 232
        # Confirmed: at most 100 a request, then a "continue" that carries on.
        done = client.post("/apps/shop/dead-letters/groups/requeue",
                           data={**form, "confirm": "yes", "csrf": csrf},
                           follow_redirects=True)  # fmt: skip
        assert 'id="done"' in done.text and "requeued 100" in done.text
        requeued = 100
        while 'id="continue"' in done.text:
            cursor = re.search(r'name="cursor" value="([^"]+)"', done.text)
            assert cursor is not None
            done = client.post("/apps/shop/dead-letters/groups/requeue",
                               data={**form, "confirm": "yes", "csrf": csrf,
                                     "cursor": cursor[1]},
                               follow_redirects=True)  # fmt: skip
            found = re.search(r"requeued (\d+)", done.text)
            assert found is not None
            requeued += int(found[1])
        assert requeued == 230
        left = q.dead_letters(app="shop")
        assert sorted((d.item.job_type if d.item else "", d.reason) for d in left) == [
            ("email", "TimeoutError: smtp"),
            ("sms", "LookupError: order 5 not found"),
        ]
        assert admin_reads.zone_count(q, q.zone("shop", "acme")) == 230
        page = client.get("/apps/shop/dead-letters/groups").text
        assert [g for g, _ in re.findall(
            r'<tr data-group="([^"]*)">.*?data-col="count">(\d+)<', page, re.S)] == [
            "email: TimeoutError: smtp", "sms: LookupError: order # not found"]  # fmt: skip
        # A purge takes its letters out of their group's count too.
        q.purge_dead_letters(app="shop", job_type="sms")
        page = client.get("/apps/shop/dead-letters/groups").text
        assert "sms:" not in page

"""A pull consumer's long poll hears of an enqueue made through the same server at once,
instead of at its next scan (the pull API's twin of the local consumer's exact timers)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from quickzones.adapters.http import TokenStore, create_app
from quickzones.adapters.http.client import RemoteError, RemoteLease, RemoteQuick
from quickzones.client import Quick
from quickzones.consumer.pull_leaser import Leased, PullConfig, PullLeaser, PullRequest
from tests.other_process import enqueue_from_another_process

from .conftest import Served, ServerThread


def test_an_enqueue_through_the_server_wakes_a_waiting_long_poll() -> None:
    q = Quick.open("memory://")
    # Scans an hour apart: only the wake-up can answer the poll within the join below.
    leaser = PullLeaser(q, pull=PullConfig(poll_s=3600, poll_max_s=3600))
    got: list[Leased] = []
    poll = threading.Thread(
        target=lambda: got.extend(leaser.lease(None, 10, lease_s=30, wait_s=7200)), daemon=True
    )
    poll.start()
    try:
        q.enqueue("job", {"n": 1}, app="a", tenant="t")
        poll.join(60)
        assert not poll.is_alive(), "the long poll slept through an enqueue"
        assert [x.item.payload for x in got] == [b'{"n":1}']
    finally:
        q.close()


def test_a_long_poll_with_nothing_enqueued_returns_empty_at_its_deadline() -> None:
    q = Quick.open("memory://")
    leaser = PullLeaser(q)
    assert leaser.lease(None, 10, lease_s=30, wait_s=0.2) == []
    q.close()


def test_an_enqueue_by_another_process_wakes_a_long_poll_over_http(tmp_path: Path) -> None:
    """On SQLite the server hears of other processes' commits (PRAGMA data_version): a
    waiting lease answers without waiting for its next scan (an hour away here)."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    q = Quick.open(url)
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["consume"])[0]
    app = create_app(q, pull=PullConfig(poll_s=3600, poll_max_s=3600))
    got: list[RemoteLease] = []
    try:
        with ServerThread(app) as server, RemoteQuick(server.url, token) as rq:
            assert rq.lease(wait_s=0) == []  # the first scan finds nothing
            poll = threading.Thread(target=lambda: got.extend(rq.lease(wait_s=20)), daemon=True)
            poll.start()
            time.sleep(0.3)  # let the poll's first scan come back empty and wait
            enqueue_from_another_process(url, "t")
            # Well before the poll's own 20 s end (where it scans once more anyway).
            poll.join(15)
            assert not poll.is_alive(), "the long poll slept through another process's enqueue"
            poll.join()
    finally:
        q.close()
    assert [x.payload for x in got] == [{"from": "elsewhere"}]


def test_long_polls_do_not_keep_waking_each_other_on_items_they_refuse(tmp_path: Path) -> None:
    """A vested zone whose items no waiting poll accepts: each visit commits (the pointer
    lease), which wakes the other polls; they back off instead of rescanning per commit."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    q.enqueue("other", 1, app="a", tenant="t")
    leaser = PullLeaser(q, pull=PullConfig(poll_s=3600, poll_max_s=3600))
    scans = 0
    scan = leaser.polls.scan

    def counted(request: PullRequest) -> tuple[list[Leased], int]:
        nonlocal scans
        scans += 1
        return scan(request)

    polls = [
        threading.Thread(target=leaser.lease, args=("a", 10, 30, 2.0, frozenset({"job"})))
        for _ in range(3)
    ]
    leaser.polls.scan = counted
    try:
        for p in polls:
            p.start()
        for p in polls:
            p.join(60)
    finally:
        q.close()
    # Backing off from 1 ms, doubling, a poll scans about a dozen times in 2 s; rescanning
    # on every commit would be thousands of scans.
    assert scans < 300, scans


def test_a_lease_holding_items_stops_filling_after_fill_s(served: Served) -> None:
    """With fill_s=0 a lease answers with the first zone that gave items, not after
    visiting more zones to fill max_items; the others stay for the next leases. Without
    fill_s it fills up to max_items."""
    for n in range(4):
        served.q.enqueue("job", n, app="a", tenant=f"t{n}")
    with RemoteQuick(served.url, served.a_all) as rq:
        leases = [rq.lease(max_items=10, wait_s=1, fill_s=0) for _ in range(4)]
        assert [len(got) for got in leases] == [1, 1, 1, 1]
        assert sorted(got[0].payload for got in leases) == [0, 1, 2, 3]
        rq.complete_many([got[0] for got in leases])
        served.q.enqueue_many("job", [4, 5], app="a", tenant="t0")
        served.q.enqueue("job", 6, app="a", tenant="t1")
        assert sorted(x.payload for x in rq.lease(max_items=10, wait_s=1)) == [4, 5, 6]
    with pytest.raises(RemoteError) as err, RemoteQuick(served.url, served.a_all) as rq:
        rq.lease(fill_s=-1)
    assert err.value.status == 422 and "fill_s" in err.value.detail


def test_an_item_nacked_through_the_server_wakes_a_waiting_long_poll(tmp_path: Path) -> None:
    """One worker gives an item back (nack, no delay) while another's long poll waits on
    the same server: the poll gets it at once, not at its next scan (an hour away)."""
    q = Quick.open(f"sqlite:///{tmp_path / 'q.db'}")
    token = TokenStore(q.kv, q.keys, q.clock).create("a", ["consume"])[0]
    app = create_app(q, pull=PullConfig(poll_s=3600, poll_max_s=3600))
    got: list[RemoteLease] = []
    try:
        with ServerThread(app) as server, RemoteQuick(server.url, token) as rq:
            q.enqueue("job", {"n": 1}, app="a", tenant="t")
            [first] = rq.lease(wait_s=5)
            poll = threading.Thread(target=lambda: got.extend(rq.lease(wait_s=20)), daemon=True)
            poll.start()
            time.sleep(0.3)  # the poll's first scan finds nothing (the item is leased)
            rq.nack(first)
            poll.join(15)  # well before the poll's own 20 s end
            assert not poll.is_alive(), "the long poll slept through the nack"
    finally:
        q.close()
    assert [x.payload for x in got] == [{"n": 1}]

"""A failing zone fails alone on every path that takes items (issue 40 points 4 and 7):
``run_until_idle`` (tests, scripts, the simulator) and ``quick serve``'s pull leases, as
the threaded consumer already does (tests/unit/test_failing_zone.py).

The complaints: a zone whose visit fails on its own (a store error of its own: a record
its visit cannot read, an item past a store limit) made ``run_until_idle`` raise and leave
every zone batched with it unrun; through the pull API the same zone answered the lease
request with an error, however many other zones had work. The failing zone is made here by
a zone store passed in at the open (``Quick(zone_store=...)``), whose dequeue of one
tenant's zone raises while ``broken`` is set.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from quickzones.backends.memory import MemoryStore
from quickzones.client import Quick
from quickzones.consumer import ConsumerConfig
from quickzones.consumer.visit_rules import ZoneVisitsFailed
from quickzones.errors import StorageError
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.zones import KVZoneStore
from tests.waiting import wait_for

BATCHED = ConsumerConfig(
    in_order=True,  # oldest pointers first: the failing zone is in the first batch
    one_transaction_visits=True,
    visits_per_transaction=4,
    selection_frac=1.0,
)


class _OneZoneFails(KVZoneStore):
    """KV zones whose dequeue of tenant "bad"'s zone raises a store error of its own."""

    broken = threading.Event()

    def dequeue(  # type: ignore[override]
        self, zone: ZoneId, *args: Any, **kwargs: Any
    ) -> tuple[list[WorkItem], list[Any]]:
        if zone.tenant == "bad" and self.broken.is_set():
            raise StorageError("this zone's record cannot be read")
        return super().dequeue(zone, *args, **kwargs)


def _open(url: str | None = None) -> Quick:
    _OneZoneFails.broken = threading.Event()
    _OneZoneFails.broken.set()

    def zones(q: Quick) -> KVZoneStore:
        return _OneZoneFails(q.kv, q.toplevel, keys=q.keys, clock=q.clock)

    if url is None:
        return Quick(MemoryStore(), zone_store=zones)
    return Quick.open(url, zone_store=zones)


def _fill(q: Quick) -> list[str]:
    q.enqueue("j", "poison", app="a", tenant="bad")  # the oldest pointer: in every batch
    return [q.enqueue("j", n, app="a", tenant=f"t{n % 3}") for n in range(9)]


def test_run_until_idle_runs_every_other_zone_and_sets_the_failing_one_aside() -> None:
    q = _open()
    ran: list[Any] = []
    q.job("j")(lambda payload, ctx: ran.append(payload))
    _fill(q)
    set_aside: list[dict[str, Any]] = []

    def observe(event: str, fields: dict[str, Any]) -> None:
        if event == "zone_set_aside":
            set_aside.append(fields)

    consumer = q.consumer(BATCHED, observer=observe)
    # Before: ZoneVisitsFailed out of run_until_idle, and the three zones batched with the
    # failing one unrun.
    assert consumer.run_until_idle() == 9
    assert sorted(ran) == list(range(9))
    assert set_aside and "cannot be read" in set_aside[0]["error"]
    _OneZoneFails.broken.clear()  # the zone's fault is mended: its backoff ends, it runs
    assert wait_for(lambda: consumer.run_until_idle() == 1, 10)
    assert "poison" in ran


def test_run_until_idle_still_raises_when_every_zone_fails() -> None:
    """Two zones failing with none working is the store failing, as the scanner has it:
    the caller hears of it."""
    q = _open()
    q.job("j")(lambda payload, ctx: None)
    q.enqueue("j", 1, app="a", tenant="bad")
    q.enqueue("j", 2, app="b", tenant="bad")
    with pytest.raises(ZoneVisitsFailed):
        q.consumer(BATCHED).run_until_idle()


def test_a_pull_lease_skips_a_failing_zone_and_leases_the_others(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from quickzones.adapters.http import TokenStore, create_app
    from quickzones.adapters.http.client import RemoteLease, RemoteQuick
    from tests.serve.conftest import ServerThread

    q = _open(f"sqlite:///{tmp_path / 'q.db'}")
    ids = _fill(q)
    tokens = TokenStore(q.kv, q.keys, q.clock)
    token = tokens.create("a", ["produce", "consume"])[0]
    app = create_app(q, tokens=tokens, config=ConsumerConfig(in_order=True, dequeue_max=10))
    try:
        with ServerThread(app) as server, RemoteQuick(server.url, token) as rq:
            # Before: the request answered 503 (the failing zone's error) with 9 items due.
            got = [x.item_id for x in rq.lease(max_items=20, wait_s=0)]
            more = [x.item_id for x in rq.lease(max_items=20, wait_s=0)]
            assert sorted(got + more) == sorted(ids)
            _OneZoneFails.broken.clear()
            late: list[RemoteLease] = []
            assert wait_for(lambda: late.extend(rq.lease(max_items=20, wait_s=0.2)) or late, 15)
            assert [x.tenant for x in late] == ["bad"]
    finally:
        q.close()

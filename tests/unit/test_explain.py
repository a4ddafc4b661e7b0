"""``quick explain`` (issue 45 point 3): for one queued item, every rule between it and a
worker in the order the consumer applies them, each case built on purpose; the first
rule that holds is the one named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.explain import Explanation, explain
from quickzones.store import heartbeats
from quickzones.store.heartbeats import Heartbeat
from quickzones.store.limits import AppLimits
from tests.conftest import store_url
from tests.unit.helpers import count_range_rows

LEASE_MS = 30_000


@pytest.fixture(params=["memory", "sqlite"])
def q(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[Quick]:
    quick = Quick.open(store_url(str(request.param), tmp_path), clock=clock)
    yield quick
    quick.close()


def _consumer(
    q: Quick,
    cid: str = "c1",
    apps: tuple[str, ...] | None = None,
    types: tuple[str, ...] | None = None,
) -> None:
    """A live consumer's heartbeat, as a running consumer writes it."""
    now = now_ms(q.clock)
    record = Heartbeat(cid, "host", 1, now, now, 2000, 8, 0, 0, apps, types, ())
    heartbeats.beat(q.kv, q.keys, record, now)


def _first(e: Explanation) -> str | None:
    return None if e.first is None else e.first.name


def test_no_consumer_alive_is_named_first(q: Quick, clock: ManualClock) -> None:
    item = q.enqueue("j", b"", app="a", tenant="t")
    e = explain(q, "a", "t", item)
    assert e.state == "vested"
    assert _first(e) == "consumer_alive"
    # A consumer whose beats stopped is not alive either.
    _consumer(q)
    clock.advance(60)
    assert _first(explain(q, "a", "t", item)) == "consumer_alive"


def test_runnable_item_nothing_holds_it(q: Quick) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    e = explain(q, "a", "t", item)
    assert e.first is None
    assert e.summary == "nothing holds it: next scan"
    names = [r.name for r in e.rules]
    # In the order the consumer applies them.
    assert names.index("consumer_alive") < names.index("vesting") < names.index("zone_lease")
    assert names.index("zone_lease") < names.index("paused") < names.index("tenant_cap")
    assert all(not r.holds for r in e.rules)


def test_delayed_item_is_not_vested_until_its_time(q: Quick, clock: ManualClock) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t", delay=60)
    e = explain(q, "a", "t", item)
    assert _first(e) == "vesting"
    assert e.first is not None and e.first.until_ms == now_ms(clock) + 60_000


def test_zone_leased_by_another_consumer(q: Quick, clock: ManualClock) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    zone = q.zone("a", "t")
    ref = q.toplevel.peek_pointers(q.toplevel.shard_for(zone), 10)[0]
    q.toplevel.obtain_pointer_lease(ref, 5_000)
    e = explain(q, "a", "t", item)
    assert _first(e) == "zone_lease"
    assert e.first is not None and e.first.until_ms == now_ms(clock) + 5_000


@pytest.mark.parametrize(
    ("pause", "rule"),
    [
        ({"app": "a"}, "paused"),
        ({"app": "a", "tenant": "t"}, "paused"),
        ({"app": "a", "job_type": "j"}, "type_paused"),
        ({"job_type": "j"}, "type_paused"),
    ],
)
def test_paused_app_tenant_or_type(q: Quick, pause: dict[str, str], rule: str) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    q.pause(**pause)
    e = explain(q, "a", "t", item)
    assert _first(e) == rule
    assert e.first is not None and all(f"{k}={v}" in e.first.detail for k, v in pause.items())
    other = q.enqueue("k", b"", app="a", tenant="t2")
    # Only a pause of the whole app holds another tenant's item of another type.
    assert _first(explain(q, "a", "t2", other)) == ("paused" if pause == {"app": "a"} else None)


def test_tenant_cap_full_names_the_running_items(q: Quick) -> None:
    _consumer(q)
    q.set_tenant_limit("a", "t", max_running=2)
    running = [q.enqueue("j", b"", app="a", tenant="t") for _ in range(2)]
    waiting = q.enqueue("j", b"", app="a", tenant="t", priority=5)
    zone = q.zone("a", "t")
    # What a consumer's visit does: take the tenant's slots, lease the items.
    assert q.limits.acquire_slots("tenant", ("a", "t"), "c1", 2, 2, LEASE_MS) == 2
    leased, _ = q.zones.dequeue(zone, 2, LEASE_MS)
    assert sorted(i.item_id for i in leased) == sorted(running)
    e = explain(q, "a", "t", waiting)
    assert _first(e) == "tenant_cap"
    assert e.first is not None
    assert "2 of 2 running" in e.first.detail
    assert sorted(e.first.items) == sorted(running)
    # A leased item's own explanation says it is out of the queue.
    mine = explain(q, "a", "t", running[0])
    assert mine.state in ("leased", "running") and _first(mine) == "item"


def test_tenant_type_cap(q: Quick) -> None:
    _consumer(q)
    q.set_tenant_limit("a", "t", "j", max_running=1)
    q.limits.acquire_slots("tenant", ("a", "t", "j"), "c1", 1, 1, LEASE_MS)
    item = q.enqueue("j", b"", app="a", tenant="t")
    assert _first(explain(q, "a", "t", item)) == "tenant_cap"
    other = q.enqueue("k", b"", app="a", tenant="t")
    assert _first(explain(q, "a", "t", other)) is None


def test_tenant_rate_names_the_next_slot(q: Quick, clock: ManualClock) -> None:
    _consumer(q)
    q.set_tenant_limit("a", "t", rate=1, per=60)
    item = q.enqueue("j", b"", app="a", tenant="t")
    assert _first(explain(q, "a", "t", item)) is None  # a slot is open now
    granted, next_ms = q.limits.grant_starts(("a", "t"), 1, 1, 60_000)  # a visit took it
    assert granted == 1
    e = explain(q, "a", "t", item)
    assert _first(e) == "tenant_rate"
    assert e.first is not None and e.first.until_ms == next_ms


def test_app_cap_and_dispatch_rate(q: Quick) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    q.set_limits("a", AppLimits(max_concurrency=1))
    q.limits.acquire_slots("app", "a", "c1", 1, 1, LEASE_MS)
    e = explain(q, "a", "t", item)
    assert _first(e) == "app_cap"
    assert e.first is not None and e.first.consumers == ("c1",)
    q.set_limits("a", AppLimits(dispatches_per_second=1))
    q.limits.grant_dispatch("a", 1)
    assert _first(explain(q, "a", "t", item)) == "app_rate"


def test_weight_is_told_and_holds_nothing(q: Quick) -> None:
    _consumer(q)
    q.set_weight("a", "t", 3)
    item = q.enqueue("j", b"", app="a", tenant="t")
    e = explain(q, "a", "t", item)
    weight = next(r for r in e.rules if r.name == "weight")
    assert not weight.holds and "weight 3" in weight.detail
    assert e.first is None


def test_no_consumer_serves_the_app_or_the_type(q: Quick) -> None:
    _consumer(q, "c1", apps=("other",))
    item = q.enqueue("j", b"", app="a", tenant="t")
    e = explain(q, "a", "t", item)
    assert _first(e) == "serves_app"
    _consumer(q, "c2", apps=("a",), types=("k",))
    assert _first(explain(q, "a", "t", item)) == "serves_type"
    _consumer(q, "c3", types=("j",))
    assert _first(explain(q, "a", "t", item)) is None


def test_finished_and_unknown_items(q: Quick) -> None:
    _consumer(q)
    item = q.enqueue("j", b"", app="a", tenant="t")
    q.cancel("a", "t", item)
    e = explain(q, "a", "t", item)
    assert e.state in ("cancelled", "absent") and _first(e) == "item"
    assert explain(q, "a", "t", "no-such").state == "absent"


def test_explain_reads_nothing_that_grows_with_tenants(q: Quick) -> None:
    _consumer(q)
    for n in range(300):
        q.enqueue("j", b"", app="a", tenant=f"t{n}")
        q.set_weight("a", f"t{n}", 2)
    item = q.enqueue("j", b"", app="a", tenant="t7")
    reads = count_range_rows(q)
    explain(q, "a", "t7", item)
    assert sum(reads) < 50, reads


def test_cli_explain_text_and_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with Quick.open(url) as q:
        item = q.enqueue("j", b"", app="a", tenant="t", delay=600)
        q.pause(app="a", tenant="t")
    runner = CliRunner()
    done = runner.invoke(main, ["explain", "a", "t", item, "--store", url])
    assert done.exit_code == 0, done.output
    assert "no consumer alive" in done.output.splitlines()[1]
    done = runner.invoke(main, ["explain", "a", "t", item, "--store", url, "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["state"] == "queued" and doc["first"] == "consumer_alive"
    assert [r["name"] for r in doc["rules"] if r["holds"]][:3] == [
        "consumer_alive",
        "serves_app",
        "vesting",
    ]
    bad = runner.invoke(main, ["explain", "a", "t", "", "--store", url])
    assert bad.exit_code != 0 and "item_id" in bad.output

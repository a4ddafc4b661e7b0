"""Tenant moves between two KV deployments (quickzones.store.tenant_move): copy the zone, then
the pointer, then remove the source; idempotent and resumable after a crash at any step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quickzones.cli import main
from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.errors import LeaseLost
from quickzones.store.records import WorkItem, ZoneId
from quickzones.store.tenant_move import KVMoveSource, move_tenant, move_zone, read_done
from tests.conftest import HAVE_POSTGRES
from tests.postgres import postgres_store_url

# Moves between stores of one kind, and to and from PostgreSQL (when a server can be had).
PAIRS = [
    "memory",
    "sqlite",
    *(["postgres", "sqlite-to-postgres", "postgres-to-sqlite"] if HAVE_POSTGRES else []),
]


@pytest.fixture(params=PAIRS)
def pair(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[tuple[Quick, Quick]]:
    kinds = str(request.param).split("-to-")
    source, target = kinds if len(kinds) == 2 else (kinds[0], kinds[0])
    if source == "memory":
        urls = ("memory://", "memory://")
    else:
        urls = (
            _url(source, tmp_path / "src.db"),
            _url(target, tmp_path / "dst.db"),
        )
    src, dst = (Quick.open(u, clock=clock) for u in urls)
    yield src, dst
    src.close()
    dst.close()


def _url(kind: str, path: Path) -> str:
    return postgres_store_url() if kind == "postgres" else f"sqlite:///{path}"


def _items(q: Quick, zone: ZoneId) -> list[WorkItem]:
    return list(KVMoveSource(q).list_items(zone))


def _fill(src: Quick, n: int = 7) -> dict[str, WorkItem]:
    for i in range(n):
        src.enqueue("job", {"n": i}, app="a", tenant="t", priority=i % 3, delay=i * 10)
    zone = src.zone("a", "t")
    # One item with an error count: lease it and requeue it with an error.
    [first], _ = src.zones.dequeue(zone, 1, 1000)
    src.zones.requeue(zone, first.item_id, first.lease_id or "", 0, error="boom")
    return {i.item_id: i for i in _items(src, zone)}


def _same(a: WorkItem, b: WorkItem) -> bool:
    fields = ("item_id", "job_type", "payload", "priority", "vesting_ms", "enqueued_ms")
    more = ("error_count", "last_error", "attempts", "content_type", "delivery", "meta")
    return all(getattr(a, f) == getattr(b, f) for f in fields + more)


def test_move_copies_zone_then_pointer_then_removes_source(pair: tuple[Quick, Quick]) -> None:
    src, dst = pair
    zone = src.zone("a", "t")
    before = _fill(src)
    report = move_tenant(src, dst, "a", "t")
    assert report.ok and report.moved == report.moved_total == 7 and report.pointer_dropped
    after = {i.item_id: i for i in _items(dst, zone)}
    assert after.keys() == before.keys()
    assert all(_same(before[k], after[k]) for k in before)
    assert [i.error_count for i in after.values()].count(1) == 1
    assert src.zones.count(zone) == 0 and dst.zones.count(zone) == 7
    assert src.toplevel.get_pointer(zone) is None
    pointer = dst.toplevel.get_pointer(zone)
    assert pointer is not None and pointer.vesting_ms <= min(i.vesting_ms for i in after.values())
    done = read_done(dst, zone)
    assert done is not None and done["moved"] == 7
    # Moving again finds nothing and changes nothing.
    again = move_tenant(src, dst, "a", "t")
    assert again.ok and again.moved == 0 and dst.zones.count(zone) == 7


class Crash(Exception):
    pass


@pytest.mark.parametrize("step", ["fence", "copy", "delete", "pointer"])
def test_crash_at_any_step_then_rerun_moves_each_item_once(
    pair: tuple[Quick, Quick], step: str, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    src, dst = pair
    zone = src.zone("a", "t")
    before = _fill(src, 12)
    source = KVMoveSource(src)
    real = {
        "fence": source.fence,
        "delete": source.delete_fenced,
        "pointer": source.drop_pointer_if_empty,
    }
    calls = {"n": 0}

    def crash_after(name: str) -> Any:
        def wrapper(*args: Any) -> Any:
            result = real[name](*args)
            calls["n"] += 1
            if calls["n"] == 1:
                raise Crash(name)
            return result

        return wrapper

    if step == "copy":
        import quickzones.store.tenant_move as tm

        real_copy = tm._copy_page

        def copy_then_crash(*args: Any) -> int:
            real_copy(*args)
            raise Crash("copy")

        monkeypatch.setattr(tm, "_copy_page", copy_then_crash)
    else:
        attr = {"fence": "fence", "delete": "delete_fenced", "pointer": "drop_pointer_if_empty"}
        monkeypatch.setattr(source, attr[step], crash_after(step))
    with pytest.raises(Crash):
        move_zone(source, dst, zone, page_size=5, clock=clock)
    monkeypatch.undo()

    # The source's consumers keep running the zone, but cannot take the fenced page.
    ran: list[str] = []
    src.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    clock.advance(200)
    src.run_until_idle()
    if step in ("fence", "copy", "delete"):
        assert len(ran) <= 12 - 5
    # A target consumer runs what was copied before the crash; the re-run must not copy
    # those again.
    done_in_target: list[str] = []
    dst.job("job")(lambda payload, ctx: done_in_target.append(ctx.item_id))
    dst.run_until_idle()

    report = move_zone(KVMoveSource(src), dst, zone, page_size=5, clock=clock)
    assert report.ok, report
    assert src.zones.count(zone) == 0 and src.toplevel.get_pointer(zone) is None
    dst.run_until_idle()
    everything = sorted(done_in_target + ran)
    assert everything == sorted(before), (step, len(everything))


def test_leased_items_wait_for_their_lease_unless_included(
    pair: tuple[Quick, Quick], clock: ManualClock
) -> None:
    src, dst = pair
    zone = src.zone("a", "t")
    _fill(src, 4)
    clock.advance(100)  # everything vested
    held, _ = src.zones.dequeue(zone, 2, 30_000)
    report = move_tenant(src, dst, "a", "t", lease_wait_s=0)
    assert not report.ok and report.skipped_leased == 2 and report.moved == 2
    assert src.toplevel.get_pointer(zone) is not None  # the zone is not empty: kept
    # Waiting: the mover sleeps (on the manual clock) until the leases end, then moves them.
    report = move_tenant(src, dst, "a", "t", lease_wait_s=5)
    assert report.ok and report.moved == 2 and dst.zones.count(zone) == 4

    src.enqueue("job", b"x", app="a", tenant="t")
    [leased], _ = src.zones.dequeue(zone, 1, 30_000)
    report = move_tenant(src, dst, "a", "t", include_leased=True, lease_wait_s=0)
    assert report.ok and report.moved == 1
    with pytest.raises(Exception) as info:  # the old holder lost it
        src.zones.complete(zone, leased.item_id, leased.lease_id)
    assert isinstance(info.value, LeaseLost | LookupError)
    moved = dst.zones.get(zone, leased.item_id)
    assert moved is not None and moved.lease_id is None and moved.vesting_ms <= clock.now() * 1000
    del held


@pytest.mark.parametrize(
    "kinds",
    [
        ("sqlite", "sqlite"),
        *([("sqlite", "postgres"), ("postgres", "sqlite")] if HAVE_POSTGRES else []),
    ],
)
def test_cli_move_tenant(tmp_path: Path, kinds: tuple[str, str]) -> None:
    src_url, dst_url = _url(kinds[0], tmp_path / "s.db"), _url(kinds[1], tmp_path / "d.db")
    src = Quick.open(src_url)
    ids = {src.enqueue("job", {"n": i}, app="a", tenant="t") for i in range(5)}
    src.close()
    result = CliRunner().invoke(
        main, ["move-tenant", "--from", src_url, "--to", dst_url, "--app", "a", "--tenant", "t"]
    )
    assert result.exit_code == 0, result.output
    assert "moved 5" in result.output
    dst = Quick.open(dst_url)
    assert {i.item_id for i in _items(dst, dst.zone("a", "t"))} == ids
    dst.close()
    same = CliRunner().invoke(
        main, ["move-tenant", "--from", src_url, "--to", src_url, "--app", "a", "--tenant", "t"]
    )
    assert same.exit_code == 2 and "same store" in same.output


# --- flow keys move with their tenant (issue 45 point 1 with the user move) ---------------


def test_a_held_idempotency_key_moves_with_its_tenant(pair: tuple[Quick, Quick]) -> None:
    """On main the key stayed on the source: the destination stored the duplicate."""
    src, dst = pair
    zone = src.zone("a", "t")
    done = src.enqueue(
        "job", 2, app="a", tenant="t", idempotency_key="paid", idempotency_ttl_s=3600
    )
    [paid], _ = src.zones.dequeue(zone, 1, 30_000)  # the TTL hold: finished on the source
    assert paid.item_id == done
    src.zones.complete(zone, paid.item_id, paid.lease_id)
    first = src.enqueue("job", 1, app="a", tenant="t", idempotency_key="order-7")
    assert move_tenant(src, dst, "a", "t").ok
    dup = dst.enqueue("job", 1, app="a", tenant="t", idempotency_key="order-7")
    assert dup == first and dup.duplicate == "queued"  # type: ignore[attr-defined]
    held = dst.enqueue("job", 2, app="a", tenant="t", idempotency_key="paid")
    assert held == done and held.duplicate == "completed"  # type: ignore[attr-defined]
    ran: list[str] = []
    dst.job("job")(lambda payload, ctx: ran.append(ctx.item_id))
    dst.run_until_idle()
    assert ran == [first]
    fresh = dst.enqueue("job", 3, app="a", tenant="t", idempotency_key="order-7")
    assert fresh != first and fresh.duplicate is None  # type: ignore[attr-defined]
    assert _flow_rows(src, zone) == []


def test_one_at_a_time_keys_and_their_waiting_items_move(pair: tuple[Quick, Quick]) -> None:
    src, dst = pair
    zone = src.zone("a", "t")
    for n in range(3):
        src.enqueue("job", n, app="a", tenant="t", one_at_a_time="acct", priority=-n)
    report = move_tenant(src, dst, "a", "t")
    assert report.ok and report.moved == 3
    assert src.zones.count(zone) == 0 and dst.zones.count(zone) == 3
    order: list[Any] = []
    while True:
        leased, _ = dst.zones.dequeue(zone, 10, 30_000)
        if not leased:
            break
        assert len(leased) == 1
        order.append(leased[0].payload)
        dst.zones.complete(zone, leased[0].item_id, leased[0].lease_id)
    assert [int(p) for p in order] == [0, 1, 2]
    assert _flow_rows(src, zone) == [] and _flow_rows(dst, zone) == []


def test_a_holder_that_finished_on_the_source_during_the_move_passes_its_key(
    pair: tuple[Quick, Quick],
) -> None:
    """The holder was running (leased) when the move began; it completes on the source
    while the mover waits for it: the destination passes the key on."""
    src, dst = pair
    zone = src.zone("a", "t")
    for n in range(2):
        src.enqueue("job", n, app="a", tenant="t", one_at_a_time="acct")
    [holder], _ = src.zones.dequeue(zone, 1, 30_000)

    class Source(KVMoveSource):
        def list_items(self, zone: ZoneId, page_size: int = 500) -> Iterator[WorkItem]:
            yield from super().list_items(zone, page_size)
            if src.zones.get(zone, holder.item_id) is not None:
                src.zones.complete(zone, holder.item_id, holder.lease_id)

    report = move_zone(Source(src), dst, zone, lease_wait_s=5)
    assert report.ok
    leased, _ = dst.zones.dequeue(zone, 10, 30_000)
    assert [int(i.payload) for i in leased] == [1]


def _flow_rows(q: Quick, zone: ZoneId) -> list[tuple[bytes, bytes]]:
    begin, end = q.keys.flow_keys_range(zone)
    return q.transact(lambda tr: tr.get_range(begin, end))

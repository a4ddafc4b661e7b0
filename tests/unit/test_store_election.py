"""The store's own scanner election on every backend (real FoundationDB included with
``QUICK_REQUIRE_FDB=1``), with a manual clock: one holder at a time, terms that only grow,
an expired lease taken over and its old holder refused; and the scanner election over it
with a configured election that fails, comes back, or reaches only some consumers."""

from __future__ import annotations

import logging
import random
import threading

import pytest

from quickzones.client import Quick
from quickzones.clock import ManualClock
from quickzones.consumer.election import Election, Leadership, LocalElection
from quickzones.consumer.scanner_election import ScannerElection, lease_name
from quickzones.consumer.store_election import StoreElection, encode_lease
from quickzones.errors import InvalidArgument, StorageError
from quickzones.store.admin import stats
from quickzones.store.kv import run

TTL = 5.0
NAME = lease_name("default")


def _election(q: Quick) -> StoreElection:
    return StoreElection(q.kv, q.keys, q.clock)


def test_one_holder_until_expiry_then_a_successor_with_a_higher_term(
    q: Quick, clock: ManualClock
) -> None:
    a, b = _election(q), _election(q)
    first = a.try_acquire(NAME, "a", TTL)
    assert first is not None and first.expires_at == clock.now() + TTL
    assert b.try_acquire(NAME, "b", TTL) is None
    again = a.try_acquire(NAME, "a", TTL)  # its own: extended, same term
    assert again is not None and again.term == first.term

    clock.advance(TTL - 0.001)
    assert b.try_acquire(NAME, "b", TTL) is None  # never before the holder's expiry
    clock.advance(0.002)
    second = b.try_acquire(NAME, "b", TTL)
    assert second is not None and second.term == first.term + 1
    assert a.renew(first, TTL) is None  # the deposed holder learns it
    assert a.release(first) is False
    assert b.renew(second, TTL) is not None


def test_renewal_keeps_the_lease_past_its_first_ttl(q: Quick, clock: ManualClock) -> None:
    a, b = _election(q), _election(q)
    lease = a.try_acquire(NAME, "a", TTL)
    for _ in range(5):
        clock.advance(TTL / 3)
        assert lease is not None
        lease = a.renew(lease, TTL)
        assert b.try_acquire(NAME, "b", TTL) is None
    assert lease is not None and lease.term == 1


def test_release_frees_at_once_and_keeps_the_term(q: Quick) -> None:
    a, b = _election(q), _election(q)
    lease = a.try_acquire(NAME, "a", TTL)
    assert lease is not None
    assert b.release(Leadership(NAME, "b", lease.term, lease.expires_at)) is False
    assert a.release(lease) is True
    assert a.release(lease) is False
    taken = b.try_acquire(NAME, "b", TTL)
    assert taken is not None and taken.term == lease.term + 1
    record = b.read(NAME)
    assert record is not None and (record.holder, record.term) == ("b", taken.term)


def test_bad_arguments_are_refused_and_change_nothing(q: Quick) -> None:
    a = _election(q)
    for ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument):
            a.try_acquire(NAME, "a", ttl)
    with pytest.raises(InvalidArgument):
        a.try_acquire("", "a", TTL)
    with pytest.raises(InvalidArgument):
        a.try_acquire(NAME, "", TTL)
    assert a.read(NAME) is None


def test_an_unreadable_record_is_taken_as_free(q: Quick) -> None:
    a = _election(q)
    run(q.kv, lambda tr: tr.set(a.lease_key(NAME), b"not a lease"))
    lease = a.try_acquire(NAME, "a", TTL)
    assert lease is not None and lease.term == 1


def test_racing_candidates_never_overlap_nor_share_a_term(q: Quick) -> None:
    """Threads race to acquire, hold briefly, release: the conflicting read lets exactly
    one win each time (the clock stands still: only releases free the lease)."""
    candidates = [(f"c{i}", _election(q)) for i in range(6)]
    lock = threading.Lock()
    active: set[str] = set()
    terms: list[int] = []
    overlaps: list[set[str]] = []
    failures: list[BaseException] = []

    def candidate(me: str, election: StoreElection) -> None:
        rng = random.Random(me)
        try:
            for _ in range(60):
                lease = election.try_acquire(NAME, me, TTL)
                if lease is None:
                    continue
                with lock:
                    if active:
                        overlaps.append(set(active) | {me})
                    active.add(me)
                    terms.append(lease.term)
                if rng.random() < 0.5:
                    renewed = election.renew(lease, TTL)
                    assert renewed is not None, "lost a lease nobody could take"
                    lease = renewed
                with lock:
                    active.discard(me)
                assert election.release(lease) is True
        except BaseException as err:
            failures.append(err)

    threads = [threading.Thread(target=candidate, args=c, daemon=True) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert not overlaps, overlaps
    assert len(terms) >= 6
    assert terms == sorted(terms) and len(set(terms)) == len(terms)


def test_quick_stats_reads_the_holder(q: Quick, clock: ManualClock) -> None:
    assert stats(q).in_order_scanner is None
    lease = _election(q).try_acquire(NAME, "worker-7", TTL)
    assert lease is not None
    s = stats(q)
    assert s.in_order_scanner is not None
    assert s.in_order_scanner.holder == "worker-7" and s.in_order_scanner.held_at(s.read_at_ms)
    clock.advance(TTL)
    s = stats(q)
    assert s.in_order_scanner is not None and not s.in_order_scanner.held_at(s.read_at_ms)


# --- the scanner election over it ------------------------------------------------------


class Switchable:
    """An election that can be made unreachable, per candidate (a partition) or for all."""

    def __init__(self, inner: Election) -> None:
        self.inner = inner
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StorageError("election server unreachable", retryable=True)

    def try_acquire(self, name: str, holder: str, ttl: float) -> Leadership | None:
        self._check()
        return self.inner.try_acquire(name, holder, ttl)

    def renew(self, lease: Leadership, ttl: float) -> Leadership | None:
        self._check()
        return self.inner.renew(lease, ttl)

    def release(self, lease: Leadership) -> bool:
        self._check()
        return self.inner.release(lease)

    def close(self) -> None:
        pass


def _trio(
    q: Quick, clock: ManualClock, configured: bool
) -> tuple[list[ScannerElection], list[Switchable]]:
    shared = LocalElection(clock)
    gates = [Switchable(shared) for _ in range(3)]
    elections = [
        ScannerElection(
            {"default": _election(q)},
            f"c{i}",
            clock,
            configured=gates[i] if configured else None,
            ttl_s=TTL,
        )
        for i in range(3)
    ]
    return elections, gates


def _round(elections: list[ScannerElection], clock: ManualClock) -> list[str]:
    """Every candidate refreshes once, a third of the TTL apart: who scans in order."""
    for e in elections:
        e.refresh(["default"])
    clock.advance(TTL / 3)
    return [e.candidate for e in elections if e.holds("default")]


def test_without_a_configured_election_exactly_one_holds(q: Quick, clock: ManualClock) -> None:
    elections, _ = _trio(q, clock, configured=False)
    for _ in range(6):
        assert _round(elections, clock) == ["c0"]
    clock.advance(TTL)  # c0 paused past its lease: it knows before its next scan
    assert not elections[0].holds("default")
    elections[1].refresh(["default"])
    assert [e.candidate for e in elections if e.holds("default")] == ["c1"]
    elections[0].refresh(["default"])  # wakes deposed
    assert [e.candidate for e in elections if e.holds("default")] == ["c1"]


def test_store_takes_over_when_the_configured_election_fails_and_hands_back(
    q: Quick, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quick.consumer")
    elections, gates = _trio(q, clock, configured=True)
    assert _round(elections, clock) == ["c0"]
    for g in gates:
        g.down = True
    for _ in range(6):  # six refreshes each, one warning each
        assert _round(elections, clock) == ["c0"]
    down = [r for r in caplog.records if "the store's election takes over" in r.getMessage()]
    assert len(down) == 3

    elections[0].release_all()  # c0 stops during the outage: another takes over at once
    elections = elections[1:]
    assert _round(elections, clock) == ["c1"]

    for g in gates:
        g.down = False
    # c2 refreshes first and wins the configured lease; c1 hands the store's lease back
    # at its refresh and c2 takes it at its next: never two, one round with none.
    c1, c2 = elections
    c2.refresh(["default"])
    assert [e.candidate for e in elections if e.holds("default")] == ["c1"]
    c1.refresh(["default"])
    assert [e.candidate for e in elections if e.holds("default")] == []
    c2.refresh(["default"])
    assert [e.candidate for e in elections if e.holds("default")] == ["c2"]
    for _ in range(3):
        assert _round(elections, clock) == ["c2"]
    back = [r for r in caplog.records if "hands back" in r.getMessage()]
    assert len(back) == 2  # once per consumer still running


def test_a_holder_cut_off_from_the_configured_election_alone_keeps_it_alone(
    q: Quick, clock: ManualClock
) -> None:
    elections, gates = _trio(q, clock, configured=True)
    gates[0].down = True  # c0 cannot reach Redis; c1 and c2 can
    assert _round(elections, clock) == ["c0"]  # c0 holds the store's lease
    for _ in range(6):
        # c1 holds the configured lease but not the store's: exactly one scans in order.
        assert _round(elections, clock) == ["c0"]
    gates[0].down = False  # c0 sees Redis again, held by c1: it hands back, c1 takes it
    assert _round(elections, clock) == ["c1"]
    assert _round(elections, clock) == ["c1"]


def test_the_stored_lease_names_the_in_order_scanner_for_stats(
    q: Quick, clock: ManualClock
) -> None:
    elections, _ = _trio(q, clock, configured=True)
    _round(elections, clock)
    record = _election(q).read(NAME)
    assert record is not None and record.holder == "c0"
    assert encode_lease(record.term, record.expires_ms, record.holder) == run(
        q.kv, lambda tr: tr.get(_election(q).lease_key(NAME))
    )

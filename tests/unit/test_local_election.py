"""The ``Election`` contract, checked on ``LocalElection`` with a manual clock (no sleeping)."""

from __future__ import annotations

import pytest

from quickzones.clock import ManualClock
from quickzones.consumer.election import Election, Leadership, LocalElection, new_candidate_id

TTL = 2.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_000.0)


@pytest.fixture
def election(clock: ManualClock) -> Election:
    return LocalElection(clock=clock)


def test_acquire_when_free_expires_ttl_from_now(election: Election) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    assert (lease.name, lease.holder, lease.expires_at) == ("scan", "a", 1_002.0)
    assert lease.term >= 1


def test_refused_while_held_and_reentrant_for_the_holder(election: Election) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    assert election.try_acquire("scan", "b", TTL) is None
    again = election.try_acquire("scan", "a", TTL)
    assert again is not None and again.term == lease.term


def test_names_are_independent(election: Election) -> None:
    assert election.try_acquire("scan-1", "a", TTL) is not None
    assert election.try_acquire("scan-2", "b", TTL) is not None


def test_renew_by_holder_extends_from_now(election: Election, clock: ManualClock) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    clock.advance(1.5)
    renewed = election.renew(lease, TTL)
    assert renewed == Leadership("scan", "a", lease.term, 1_003.5)
    clock.advance(1.0)  # past the first expiry, inside the renewed one
    assert election.try_acquire("scan", "b", TTL) is None


def test_renew_by_non_holder_or_wrong_term_returns_none(election: Election) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    assert election.renew(Leadership("scan", "b", lease.term, lease.expires_at), TTL) is None
    assert election.renew(Leadership("scan", "a", lease.term + 1, lease.expires_at), TTL) is None
    assert election.renew(lease, TTL) is not None


def test_renew_after_expiry_returns_none(election: Election, clock: ManualClock) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    clock.advance(TTL)  # expires_at is exclusive: at that instant the lease is gone
    assert election.renew(lease, TTL) is None


def test_expired_lease_goes_to_the_next_candidate_with_a_larger_term(
    election: Election, clock: ManualClock
) -> None:
    dead = election.try_acquire("scan", "a", TTL)
    assert dead is not None
    clock.advance(TTL - 0.001)
    assert election.try_acquire("scan", "b", TTL) is None
    clock.advance(0.001)
    successor = election.try_acquire("scan", "b", TTL)
    assert successor is not None and successor.term > dead.term


def test_deposed_holder_cannot_renew_or_release(election: Election, clock: ManualClock) -> None:
    old = election.try_acquire("scan", "a", TTL)
    assert old is not None
    clock.advance(TTL + 1)  # "a" was paused past its TTL
    new = election.try_acquire("scan", "b", TTL)
    assert new is not None
    assert election.renew(old, TTL) is None
    assert election.release(old) is False
    assert election.renew(new, TTL) is not None


def test_same_holder_after_expiry_gets_a_new_term(election: Election, clock: ManualClock) -> None:
    first = election.try_acquire("scan", "a", TTL)
    assert first is not None
    clock.advance(TTL)
    second = election.try_acquire("scan", "a", TTL)
    assert second is not None and second.term > first.term
    assert election.renew(first, TTL) is None  # the old (holder, term) pair is dead


def test_release_only_by_holder_frees_at_once(election: Election) -> None:
    lease = election.try_acquire("scan", "a", TTL)
    assert lease is not None
    assert election.release(Leadership("scan", "b", lease.term, lease.expires_at)) is False
    assert election.release(lease) is True
    assert election.release(lease) is False
    successor = election.try_acquire("scan", "b", TTL)
    assert successor is not None and successor.term > lease.term


def test_terms_strictly_increase_over_many_handovers(election: Election) -> None:
    terms = []
    for _ in range(50):
        lease = election.try_acquire("scan", new_candidate_id(), TTL)
        assert lease is not None
        terms.append(lease.term)
        assert election.release(lease)
    assert terms == sorted(set(terms))


def test_close_is_harmless(election: Election) -> None:
    election.close()

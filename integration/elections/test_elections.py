"""Election behaviour against real Redis and memcached servers (and LocalElection).

Each test states one property the sequential scanner relies on: one holder at a time,
fencing terms that only grow (also across a server restart that loses every key), a dead or
paused holder replaced within its TTL, and a lost server reported fast as retryable.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import pytest

from quickzones.clock import ManualClock
from quickzones.consumer.election import Election, Leadership
from quickzones.errors import InvalidArgument, StorageError
from quickzones.urls import open_election

if TYPE_CHECKING:
    from integration.elections.conftest import Kit

T = TypeVar("T")

TTL = 1.0  # memcached's minimum; everything below waits in multiples of it


def eventually(fn: Callable[[], T | None], within: float, every: float = 0.02) -> T:
    """Call ``fn`` until it returns non-None (retryable storage errors count as None)."""
    deadline = time.monotonic() + within
    while True:
        try:
            got = fn()
        except StorageError as err:
            if not err.retryable:
                raise
            got = None
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        time.sleep(every)


def settle(fn: Callable[[], T], within: float) -> T:
    """Call ``fn`` until it stops raising retryable storage errors; return what it gave."""
    deadline = time.monotonic() + within
    while True:
        try:
            return fn()
        except StorageError as err:
            if not err.retryable or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


# --- the basic contract ---------------------------------------------------------------


def test_acquire_when_free(kit: Kit, name: str) -> None:
    before = time.time()
    lease = kit.open().try_acquire(name, "a", TTL)
    after = time.time()

    assert lease is not None
    assert (lease.name, lease.holder) == (name, "a")
    assert lease.term > 0
    assert before + TTL <= lease.expires_at <= after + TTL


def test_second_candidate_refused_while_held(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None

    assert b.try_acquire(name, "b", TTL) is None
    # Acquiring again as the holder (a retry after a lost reply) keeps the term.
    again = a.try_acquire(name, "a", TTL)
    assert again is not None and again.term == lease.term


def test_names_are_independent(kit: Kit, name: str) -> None:
    election = kit.open()
    assert election.try_acquire(name + "-x", "a", TTL) is not None
    assert election.try_acquire(name + "-y", "b", TTL) is not None


def test_renew_by_holder_extends(kit: Kit, name: str) -> None:
    # A longer lease than the other tests: the sleeps below must land inside known windows
    # even on a loaded machine (memcached ticks whole seconds, so 1 s leaves no margin).
    ttl = 4.0
    a, b = kit.open(), kit.open()
    lease = a.try_acquire(name, "a", ttl)
    assert lease is not None
    time.sleep(0.5 * ttl)

    renewed = a.renew(lease, ttl)
    assert renewed is not None
    assert renewed.term == lease.term
    assert renewed.expires_at > lease.expires_at

    # Past the first expiry, well inside the renewed one.
    time.sleep(max(0.0, lease.expires_at - time.time()) + 0.3)
    assert time.time() < renewed.expires_at - 0.5, "the machine stalled past the test's window"
    assert b.try_acquire(name, "b", ttl) is None
    assert a.renew(renewed, ttl) is not None


def test_renew_by_non_holder_returns_none(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None

    stranger = Leadership(name, "b", lease.term, lease.expires_at)
    wrong_term = Leadership(name, "a", lease.term + 1, lease.expires_at)
    assert b.renew(stranger, TTL) is None
    assert a.renew(wrong_term, TTL) is None
    assert a.renew(lease, TTL) is not None  # the failed attempts changed nothing


def test_renew_by_deposed_holder_returns_none(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    old = a.try_acquire(name, "a", TTL)
    assert old is not None and a.release(old)
    new = b.try_acquire(name, "b", TTL)
    assert new is not None and new.term > old.term

    assert a.renew(old, TTL) is None
    assert a.release(old) is False
    assert b.renew(new, TTL) is not None


def test_release_only_by_holder(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None

    assert b.release(Leadership(name, "b", lease.term, lease.expires_at)) is False
    assert b.try_acquire(name, "b", TTL) is None
    assert a.release(lease) is True
    assert a.release(lease) is False

    successor = b.try_acquire(name, "b", TTL)  # free at once, no waiting for the TTL
    assert successor is not None and successor.term > lease.term


def test_rejects_bad_ttl(kit: Kit, name: str) -> None:
    if kit.kind == "local":
        pytest.skip("LocalElection does not validate its arguments")
    election = kit.open()
    for ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument):
            election.try_acquire(name, "a", ttl)


# --- failures of the holder -----------------------------------------------------------


def test_dead_holder_replaced_within_ttl_plus_one_second(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    start = time.monotonic()
    dead = a.try_acquire(name, "a", TTL)
    assert dead is not None
    # "a" dies: it never renews. "b" keeps trying like a standby scanner would.

    successor = eventually(lambda: b.try_acquire(name, "b", TTL), within=TTL + 2)
    waited = time.monotonic() - start

    assert successor.term > dead.term
    assert waited >= TTL - 0.05  # never before the dead holder's own expiry
    assert waited <= TTL + 1.0 + 0.15  # 0.15 s: polling and scheduling


def test_paused_holder_finds_itself_deposed(kit: Kit, name: str) -> None:
    a, b = kit.open(), kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None

    # "a" is paused (GC, SIGSTOP, swapped out) and sleeps past its TTL while "b" takes over.
    successor = eventually(lambda: b.try_acquire(name, "b", TTL), within=TTL + kit.slack + 1)
    time.sleep(0.05)

    assert time.time() > lease.expires_at  # a could have known locally it had to stop
    assert a.renew(lease, TTL) is None
    assert a.release(lease) is False
    assert b.renew(successor, TTL) is not None


def test_lease_lapses_without_a_successor(kit: Kit, name: str) -> None:
    a = kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None

    time.sleep(TTL + kit.slack + 0.1)  # past the server's own expiry, nobody else asked
    assert a.renew(lease, TTL) is None
    again = a.try_acquire(name, "a", TTL)
    assert again is not None and again.term > lease.term


def test_racing_candidates_never_share_a_term_or_overlap(kit: Kit, name: str) -> None:
    threads_n, run_for = 8, 1.5
    elections = [kit.open() for _ in range(threads_n)]
    lock = threading.Lock()
    active: set[str] = set()
    terms: list[int] = []
    holders_by_term: dict[int, str] = {}
    overlaps: list[tuple[str, set[str]]] = []
    failures: list[BaseException] = []
    stop_at = time.monotonic() + run_for

    def candidate(me: str, election: Election) -> None:
        rng = random.Random(me)
        try:
            while time.monotonic() < stop_at:
                asked = time.monotonic()  # the lease's TTL runs from no earlier than this
                asked_server = kit.server_now() if kit.server_now else None
                lease = election.try_acquire(name, me, TTL)
                if lease is None:
                    time.sleep(rng.uniform(0.0005, 0.003))
                    continue
                with lock:
                    if active:
                        overlaps.append((me, set(active)))
                    active.add(me)
                    terms.append(lease.term)
                    holders_by_term.setdefault(lease.term, me)
                    if holders_by_term[lease.term] != me:
                        overlaps.append((me, {holders_by_term[lease.term]}))
                time.sleep(rng.uniform(0.001, 0.01))  # lead a little
                renewed = election.renew(lease, TTL)
                with lock:
                    active.discard(me)  # stop leading *before* the server lets go
                # A renewal within the TTL must hold (nobody could take the lease). One the
                # host delayed past it (a loaded CI machine) may rightly find it gone.
                # The server's clock counts too: Redis expires keys by its wall clock, and a
                # step of that clock ends a lease early whatever a client does.
                if renewed is None:
                    ours = time.monotonic() - asked
                    theirs = (
                        kit.server_now() - asked_server
                        if kit.server_now and asked_server is not None
                        else 0.0
                    )
                    assert max(ours, theirs) >= TTL, (
                        f"lost a lease nobody could take: {ours:.3f} s by our clock, "
                        f"{theirs:.3f} s by the server's"
                    )
                    continue
                assert election.release(renewed) is True
                time.sleep(rng.uniform(0.002, 0.006))  # let the others race for it
        except BaseException as err:
            failures.append(err)

    threads = [
        threading.Thread(target=candidate, args=(f"c{i}", elections[i]), daemon=True)
        for i in range(threads_n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(run_for + 10)

    assert not failures, failures
    assert not overlaps, overlaps
    assert len(terms) >= 10, "too few handovers to mean anything"
    assert len(set(terms)) == len(terms), "a term was handed out twice"
    assert terms == sorted(terms), "terms went backwards between holders"
    assert len(set(holders_by_term.values())) > 1


# --- failures of the server -----------------------------------------------------------


def test_server_restart_loses_the_lease_but_terms_keep_growing(server_kit: Kit, name: str) -> None:
    assert server_kit.server is not None
    a, b = server_kit.open(), server_kit.open()
    first = a.try_acquire(name, "a", 5.0)
    assert first is not None

    server_kit.server.restart()  # SIGKILL, same port, every key gone

    # The old holder learns it lost the lease (once its client has reconnected).
    assert settle(lambda: a.renew(first, 5.0), within=3) is None

    # A standby takes over; its term is above everything handed out before the restart.
    second = eventually(lambda: b.try_acquire(name, "b", 5.0), within=3)
    assert second.term > first.term
    assert b.release(second)

    # Quick successive restarts (well inside one second) still never reuse a term, not
    # even for the same holder id.
    seen = [first.term, second.term]
    for _ in range(3):
        server_kit.server.restart()
        lease = eventually(lambda: a.try_acquire(name, "a", 5.0), within=3)
        assert lease.term > max(seen)
        seen.append(lease.term)


def test_unreachable_server_raises_retryable_storage_error_quickly(
    server_kit: Kit, name: str
) -> None:
    assert server_kit.server is not None
    election = server_kit.open()
    lease = election.try_acquire(name, "a", 5.0)
    assert lease is not None

    def assert_fast_retryable(call: Callable[[], object]) -> None:
        start = time.monotonic()
        with pytest.raises(StorageError) as info:
            call()
        assert time.monotonic() - start < 1.0
        assert info.value.retryable is True
        assert info.value.__cause__ is not None  # the driver's error is kept

    # A hung server: connections are accepted but nothing answers, so timeouts must fire.
    server_kit.server.pause()
    try:
        assert_fast_retryable(lambda: election.try_acquire(name, "b", 5.0))
        assert_fast_retryable(lambda: election.renew(lease, 5.0))
    finally:
        server_kit.server.resume()
    assert eventually(lambda: election.renew(lease, 5.0), within=3) is not None

    # A server that is gone: connections are refused.
    server_kit.server.stop()
    assert_fast_retryable(lambda: election.try_acquire(name, "b", 5.0))
    assert_fast_retryable(lambda: election.renew(lease, 5.0))
    assert_fast_retryable(lambda: election.release(lease))


# --- wiring ---------------------------------------------------------------------------


def test_open_election_uses_the_injected_clock(server_kit: Kit, name: str) -> None:
    assert server_kit.server is not None
    clock = ManualClock(start=1_000.0)
    election = open_election(server_kit.server.url, clock=clock)
    try:
        lease = election.try_acquire(name, "a", 2.0)
        assert lease is not None and lease.expires_at == 1_002.0
        clock.advance(1.0)
        renewed = election.renew(lease, 2.0)
        assert renewed is not None and renewed.expires_at == 1_003.0
    finally:
        election.close()


def test_tls_passthrough_to_a_tls_only_server(tls_kit: Kit, name: str) -> None:
    assert tls_kit.server is not None
    assert "ca" in tls_kit.server.url  # the URL carries the CA file for verification
    a, b = tls_kit.open(), tls_kit.open()
    lease = a.try_acquire(name, "a", TTL)
    assert lease is not None
    assert b.try_acquire(name, "b", TTL) is None
    assert a.renew(lease, TTL) is not None
    assert a.release(lease) is True

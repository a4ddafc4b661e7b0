"""A pull consumer's long poll hears of an enqueue made through the same server at once,
instead of at its next scan (the pull API's twin of the local consumer's exact timers)."""

from __future__ import annotations

import threading

from quickzones.client import Quick
from quickzones.serve.pull import Leased, PullConfig, PullLeaser


def test_an_enqueue_through_the_server_wakes_a_waiting_long_poll() -> None:
    q = Quick.open("memory://")
    # Scans an hour apart: only the wake-up can answer the poll within the join below.
    leaser = PullLeaser(q, PullConfig(poll_s=3600, poll_max_s=3600))
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

"""The fairness view's figures (issue 31 point 6), read as ``quick serve`` reads them:
the noisy rule (over a tenth of the leased items), who waits longest first, what is
paused, and the history charts (inline SVG, every text escaped)."""

from __future__ import annotations

from quickzones.adapters.http import charts, fairness
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.store import pickups


def test_noisy_waiting_longest_first_and_paused(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    try:
        q.enqueue_many("job", list(range(20)), app="a", tenant="big")
        clock.advance(5)
        q.enqueue_many("job", list(range(3)), app="a", tenant="small")
        clock.advance(5)
        q.enqueue("job", 1, app="a", tenant="new")
        # A consumer holds 9 of big's items and 1 of small's: 1 of 10 is not over a tenth.
        q.items.dequeue(q.zone("a", "big"), 9, 30_000)
        q.items.dequeue(q.zone("a", "small"), 1, 30_000)
        q.pause("a", "small")
        q.pause("a", job_type="job")
        view = fairness.fairness(q, "a", q.pauses.of_app("a"))
        rows = {r.tenant: r for r in view.rows}
        assert [r.tenant for r in view.rows] == ["big", "small", "new"]
        assert (rows["big"].queued, rows["big"].running, rows["big"].noisy) == (11, 9, True)
        assert (rows["small"].queued, rows["small"].running, rows["small"].noisy) == (2, 1, False)
        assert rows["big"].waiting_s(view.now_ms) == 10.0
        assert (rows["small"].paused, rows["big"].paused) == ("tenant", "job")
        assert view.running == 10 and view.job_types == ["job"]
        assert (rows["new"].policy.weight, rows["new"].policy.limits) == ("1", "none")
    finally:
        q.close()


def test_history_charts(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    try:
        now = now_ms(clock)
        m = pickups.minute_of(now)
        pickups.add_counts(q.kv, q.keys, {("a", "<t>", m - 2, 3): 30, ("a", "<t>", m, 0): 5}, now)
        points = fairness.history(q, "a")
        assert [(p.started, p.p99_ms) for p in points[-3:]] == [(30, 100), (0, None), (5, 10)]
        bars = str(charts.throughput_chart(points))
        assert bars.count("<rect") == 2 and 'data-started="30"' in bars
        lines = str(charts.latency_chart(points))
        assert lines.count('<circle data-series="p99"') == 2 and "<script" not in lines
        assert "<t>" not in bars + lines  # tenant names never reach the charts unescaped
    finally:
        q.close()

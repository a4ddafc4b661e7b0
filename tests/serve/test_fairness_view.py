"""The fairness view's figures (issue 31 point 6), read as ``quick serve`` reads them:
its sections (issue 43 point 3), the noisy rule (over a tenth of the app's pickups), who
waits longest first, what is paused and capped, and the history charts (inline SVG,
every text escaped)."""

from __future__ import annotations

from quickzones.adapters.http import charts, fairness
from quickzones.client import Quick
from quickzones.clock import ManualClock, now_ms
from quickzones.store import pickups


def test_sections_noisy_waiting_longest_first_paused_and_capped(clock: ManualClock) -> None:
    q = Quick.open("memory://", clock=clock)
    try:
        q.enqueue_many("job", list(range(20)), app="a", tenant="big")
        clock.advance(5)
        q.enqueue_many("job", list(range(3)), app="a", tenant="small")
        clock.advance(5)
        q.enqueue("job", 1, app="a", tenant="new")
        now = now_ms(clock)
        m = pickups.minute_of(now)
        # big: 9 of the app's 10 pickups (noisy); small: 1 of 10 is not over a tenth.
        pickups.add_counts(q.kv, q.keys, {("a", "big", m, 3): 9, ("a", "small", m, 3): 1}, now)
        q.pause("a", "small")
        q.pause("a", job_type="job")
        q.set_tenant_limit("a", "new", max_running=3)
        view = fairness.fairness(q, "a")
        by = {s.name: s for s in view.sections}
        assert [r.tenant for r in by["waiting"].rows] == ["big", "small", "new"]
        assert [r.tenant for r in by["noisy"].rows] == ["big", "small"]
        assert [r.tenant for r in by["paused"].rows] == ["small"]
        assert [r.tenant for r in by["capped"].rows] == ["new"]
        big, small = by["noisy"].rows
        assert (big.queued, big.picked, big.noisy) == (20, 9, True)
        assert (small.queued, small.picked, small.noisy) == (3, 1, False)
        assert big.waiting_since_ms == now - 10_000
        assert (small.paused, big.paused) == ("tenant", "job")
        assert view.picked == 10
        new = by["capped"].rows[0]
        assert (new.policy.weight, new.policy.limits, new.held) == ("1", "3 running", 0)
        only = fairness.fairness(q, "a", section="waiting", limit=2)
        assert [r.tenant for r in only.sections[0].rows] == ["big", "small"]
        rest = fairness.fairness(q, "a", section="waiting", cursor=only.sections[0].next_cursor)
        assert [r.tenant for r in rest.sections[0].rows] == ["new"]
        assert rest.sections[0].next_cursor is None
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

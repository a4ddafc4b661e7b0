"""The demo's CPU-per-item bench (issue 40 point 9) itself: one run drains every item of
the demo's shape and reports a CPU time for it, and the A/B child is this tree's file run
by an interpreter, reading back the same figures."""

from __future__ import annotations

import sys

from bench import demo_cpu


def test_one_run_drains_the_demo_shape_and_reports_its_cpu() -> None:
    r = demo_cpu.child(sys.executable)

    assert r["items"] == demo_cpu.SMALL * demo_cpu.SMALL_ITEMS + demo_cpu.NOISY_ITEMS
    assert 0 < r["visits"] < r["items"]
    assert r["cpu_us_per_item"] > 0

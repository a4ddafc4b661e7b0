"""Benchmarks that cannot lie about scaling (issue 29 point 4): a saturation backlog holds
more than the consumers' workers could run over the run, and a run that drains it fails
instead of reporting the backlog's size as a rate."""

from __future__ import annotations

import pytest

from bench import paper, scaling


@pytest.mark.parametrize("consumers", [1, 2, 4, 8])
def test_paper_backlog_outlasts_the_workers_bound(consumers: int) -> None:
    seconds = 5.0
    items = paper.backlog_size(paper.SATURATION, consumers, seconds)
    # 64 workers x 20 items/s each a consumer, over the run, with room to spare.
    assert items >= 1.5 * consumers * 64 * 20 * seconds


def test_a_paper_run_that_drains_its_backlog_fails() -> None:
    paper.check_not_drained("ok", 10_000, 8_000)
    with pytest.raises(paper.BacklogDrained, match="9,500 of the backlog's 10,000"):
        paper.check_not_drained("(a) 2 consumers", 10_000, 9_500)


@pytest.mark.parametrize("name", sorted(scaling.WORKLOADS))
def test_scaling_backlog_is_sized_from_the_bound(name: str) -> None:
    workload = scaling.WORKLOADS[name]
    for n in (1, 2, 4, 8):
        assert workload.bound(n) == n * workload.bound(1)
    assert scaling.WORKLOADS["sleep50"].bound(1) == 64 * 1000 / 50


def test_the_peers_job_modules_do_not_import_quick() -> None:
    """Every peer's job module imports ``bench.common`` for ``record_start``; a drain is
    timed from its worker's spawn, so a worker that imported quick there (0.15-0.19 s
    here, through ``bench.common``'s percentile) started late, to quick's advantage."""
    import subprocess
    import sys

    code = (
        "import sys, bench.common;"
        " print(sorted(m for m in sys.modules if m.startswith('quickzones')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", f"bench.common imports {out.strip()}"

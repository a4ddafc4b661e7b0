"""A Django task's runs as its result shows them (adapters/django/runs.py), without a
worker: the history a task retried many times keeps stays bounded (the first failed run
and the newest), ``worker_ids`` still has one entry per run, and what an item's metadata
holds that this did not write reads as no history."""

from __future__ import annotations

import pytest

pytest.importorskip("django")
runs = pytest.importorskip("quickzones.adapters.django.runs")


def _failed(n: int) -> object:
    try:
        raise ValueError(f"run {n}:\n" + "x" * 10_000)  # a long one, cut
    except ValueError as err:
        return runs.failed_run(err, 1000 + n, f"host:{n}")


def test_a_thousand_failures_keep_the_first_and_the_newest_each_bounded() -> None:
    history = runs.History()
    for n in range(1, 1001):
        history = runs.history_of({runs.RUNS: history.with_failure(_failed(n)).stored()})
    assert history.failed == 1000 and history.first_ms == 1001
    kept = [int(trace.split("ValueError: run ")[1].split(":")[0]) for _, trace in history.errors()]
    assert kept == [1, 997, 998, 999, 1000]
    assert all(len(trace.encode()) <= runs.TRACE_BYTES for _, trace in history.errors())
    ids = history.worker_ids(1001, runs.Run(5000, "host:last"))
    assert len(ids) == 1001
    assert ids[:2] == ["host:1", runs.WORKER_ID] and ids[-2:] == ["host:1000", "host:last"]


@pytest.mark.parametrize(
    "meta",
    [None, {}, {runs.RUNS: "x"}, {runs.RUNS: {"kept": [["a", 1]], "failed": "2"}}],
)
def test_metadata_this_did_not_write_is_no_history(meta: object) -> None:
    history = runs.history_of(meta)
    assert (history.failed, history.errors(), history.first_ms) == (0, [], None)
    assert history.worker_ids(2) == [runs.WORKER_ID] * 2
